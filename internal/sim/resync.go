package sim

// Resync re-announces the whole prefix cache: AllBlocksCleared, then one
// BlockStored per cached block, each after the block it chains from. A
// consumer that lost events (a NATS outage, a dropped batch) ends up with
// exactly the engine's cache again. A block whose parent was evicted is
// announced with that parent anyway, as it was originally; consumers drop it
// like vLLM's own orphans. Nothing in the cache changes.
func (e *Engine) Resync() {
	e.sink.KVEvent(Event{Kind: AllBlocksCleared})
	p := e.pool
	done := make(map[int64]bool, len(p.cache))
	var chain []int32
	for id := range p.blocks {
		b := &p.blocks[id]
		if !b.cached || done[b.hash] {
			continue
		}
		// Walk up to the first ancestor not yet announced (or not cached),
		// then announce down the chain.
		chain = append(chain[:0], int32(id))
		for cur := b; cur.hasParent && len(chain) <= len(p.cache); {
			pid, ok := p.cache[cur.parent]
			if !ok || done[cur.parent] {
				break
			}
			chain = append(chain, pid)
			cur = &p.blocks[pid]
		}
		for i := len(chain) - 1; i >= 0; i-- {
			cb := &p.blocks[chain[i]]
			h := cb.hash
			e.sink.KVEvent(Event{
				Kind: BlockStored, Hashes: []int64{h}, Parent: cb.parent, HasParent: cb.hasParent,
				Tokens: p.blockTokens(chain[i]), BlockSize: e.cfg.BlockSize,
			})
			done[h] = true
		}
	}
}
