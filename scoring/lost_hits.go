package scoring

import "time"

// Hits lost before a request runs. A decision counts the prompt blocks its
// worker holds as cached, but a request that waits in the engine's queue
// behind other prefills runs only once they are done, and the blocks those
// prefills allocate come from the least recently used end of the cache:
// an old prefix can be evicted before the request that was sent for it
// starts. The engine then recomputes it, so the request's prefill, and the
// worker's backlog behind it, are larger than the decision priced, and
// later decisions would keep sending work to a worker whose queue is
// longer than it looks.
//
// The worker's KV events say when that happens. Engines evict a prefix
// from its deepest block up (vLLM frees a request's blocks tail first; a
// block is never used more recently than its parent; SGLang's radix tree
// evicts leaves), so the deepest block a local request in prefill was
// counted as holding is the first of its hit to go. The pool watches that
// block; when the worker's events remove it (kvindex.RemovalObserver), the
// request's hit shrinks to the blocks still held above it, and its
// uncached tokens, its attention work and the worker's backlog grow by
// what the engine will now compute. A peer's request is not watched: its
// owner does that, and tells no one (fleet.SyncEvent carries no change of
// prefill size).

// holdLocked records that a, just dispatched, was counted as holding its
// first held prompt blocks on its worker.
func (p *Pool) holdLocked(a *active, held int) {
	held = min(held, len(a.hashes))
	if held <= 0 || a.prefillTokens == 0 {
		return
	}
	w := a.w
	if w.holding == nil {
		w.holding = make(map[uint64][]*active)
	}
	a.held = held
	h := a.hashes[held-1]
	w.holding[h] = append(w.holding[h], a)
}

// unholdLocked stops watching a's hit, if it is watched.
func (p *Pool) unholdLocked(a *active) {
	if a.held == 0 {
		return
	}
	w, h := a.w, a.hashes[a.held-1]
	as := w.holding[h]
	for i, x := range as {
		if x == a {
			as = append(as[:i], as[i+1:]...)
			break
		}
	}
	if len(as) == 0 {
		delete(w.holding, h)
	} else {
		w.holding[h] = as
	}
	a.held = 0
}

// BlocksRemoved takes the blocks a worker's events removed off the hits of
// its local requests in prefill: a request that was counted as holding one
// of them will compute it, and every block after it, itself. The KV index
// calls it under its lock (kvindex.RemovalObserver). Unknown workers are
// ignored.
func (p *Pool) BlocksRemoved(worker string, hashes []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workers[worker]
	if w == nil {
		return
	}
	if len(w.recency) > 0 {
		w.evictedLocked(hashes)
	}
	if len(w.holding) == 0 {
		return
	}
	var gone map[uint64]struct{}
	now := p.opts.Now()
	defer func() {
		if gone != nil {
			p.summarizeLocked(w)
		}
	}()
	for _, h := range hashes {
		as, ok := w.holding[h]
		if !ok {
			continue
		}
		delete(w.holding, h)
		if gone == nil {
			gone = make(map[uint64]struct{}, len(hashes))
			for _, g := range hashes {
				gone[g] = struct{}{}
			}
		}
		for _, a := range as {
			// The blocks above the removed one may have gone in the
			// same batch.
			held := a.held - 1
			for held > 0 {
				if _, g := gone[a.hashes[held-1]]; !g {
					break
				}
				held--
			}
			a.held = 0
			p.loseHitLocked(a, held, now)
			p.holdLocked(a, held)
		}
	}
}

// loseHitLocked grows a's prefill to everything after its first held
// prompt blocks, and its worker's backlog with it.
func (p *Pool) loseHitLocked(a *active, held int, now time.Time) {
	w := a.w
	prefill := max(a.promptTokens-held*w.spec.BlockSize, 0)
	if prefill <= a.prefillTokens {
		return
	}
	attn := attentionWork(prefill, a.promptTokens-prefill)
	dn, da := prefill-a.prefillTokens, attn-a.prefillAttn
	p.settleBacklogLocked(w, now)
	w.prefillTokens += dn
	chargeAllocations(w, dn)
	w.prefillAttn += da
	w.backlog += float64(dn)
	w.backlogAttn += da
	if a.fitX >= 0 {
		a.fitX += float64(dn)
		a.fitZ += da
	}
	a.prefillTokens, a.prefillAttn = prefill, attn
	p.addChurnLocked(w, dn, now)
	p.opts.Metrics.HitLost(dn)
}
