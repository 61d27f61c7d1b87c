package sim

// blockPool is the paged KV cache: a fixed array of blocks, a map from
// engine hash to the cached block holding it, reference counts, and a free
// queue in LRU order. A free block keeps its cached content until it is
// reused, so a later request can still hit it; popping a cached block off
// the free queue evicts it (BlockRemoved).
type blockPool struct {
	blocks   []block
	cache    map[int64]int32
	freeHead int32
	freeTail int32
	numFree  int
	// evicted collects hashes evicted during one allocation so they go out
	// as one BlockRemoved event.
	evicted []int64
	// tokens holds each block's token ids (block i at i*bs), kept so the
	// cache can be re-announced (resync) without the requests that filled it.
	tokens []int32
	bs     int
}

type block struct {
	hash       int64
	parent     int64 // hash of the previous block in its chain
	ref        int32
	prev, next int32 // free-queue links, -1 at the ends
	cached     bool
	hasParent  bool
	free       bool
}

const noBlock = -1

func newBlockPool(n, bs int) *blockPool {
	p := &blockPool{
		blocks:   make([]block, n),
		cache:    make(map[int64]int32, n),
		freeHead: noBlock,
		freeTail: noBlock,
		tokens:   make([]int32, n*bs),
		bs:       bs,
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = noBlock, noBlock
		p.pushFree(int32(i))
	}
	return p
}

func (p *blockPool) pushFree(id int32) {
	b := &p.blocks[id]
	b.free = true
	b.prev, b.next = p.freeTail, noBlock
	if p.freeTail != noBlock {
		p.blocks[p.freeTail].next = id
	} else {
		p.freeHead = id
	}
	p.freeTail = id
	p.numFree++
}

func (p *blockPool) unlinkFree(id int32) {
	b := &p.blocks[id]
	if b.prev != noBlock {
		p.blocks[b.prev].next = b.next
	} else {
		p.freeHead = b.next
	}
	if b.next != noBlock {
		p.blocks[b.next].prev = b.prev
	} else {
		p.freeTail = b.prev
	}
	b.prev, b.next, b.free = noBlock, noBlock, false
	p.numFree--
}

// lookup returns the cached block holding hash.
func (p *blockPool) lookup(hash int64) (int32, bool) {
	id, ok := p.cache[hash]
	return id, ok
}

// touch takes a reference on a cached block found by lookup, pulling it off
// the free queue if nobody held it.
func (p *blockPool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 && b.free {
		p.unlinkFree(id)
	}
	b.ref++
}

// allocate pops a block from the head of the free queue, evicting its
// cached content. The caller checks numFree first.
func (p *blockPool) allocate() int32 {
	id := p.freeHead
	p.unlinkFree(id)
	b := &p.blocks[id]
	if b.cached {
		delete(p.cache, b.hash)
		p.evicted = append(p.evicted, b.hash)
		b.cached = false
	}
	b.ref = 1
	return id
}

// release drops references on blocks, last block first, so that when the
// free queue is consumed a sequence's tail is evicted before its prefix.
func (p *blockPool) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushFree(id)
		}
	}
}

// cacheBlock registers a full block under hash. It reports false when
// another block already holds that content; the block then stays
// uncached, so each hash lives in exactly one block and every BlockRemoved
// matches one BlockStored.
func (p *blockPool) cacheBlock(id int32, hash, parent int64, hasParent bool, tokens []int32) bool {
	if _, dup := p.cache[hash]; dup {
		return false
	}
	b := &p.blocks[id]
	b.hash, b.parent, b.hasParent, b.cached = hash, parent, hasParent, true
	copy(p.tokens[int(id)*p.bs:], tokens)
	p.cache[hash] = id
	return true
}

// blockTokens returns the token ids a cached block holds.
func (p *blockPool) blockTokens(id int32) []int32 {
	return p.tokens[int(id)*p.bs : int(id+1)*p.bs]
}

// clear drops every cached hash. Blocks stay where they are.
func (p *blockPool) clear() {
	for id := range p.blocks {
		p.blocks[id].cached = false
	}
	clear(p.cache)
}

// usedBlocks counts blocks referenced by some request.
func (p *blockPool) usedBlocks() int { return len(p.blocks) - p.numFree }

// takeEvicted returns and resets the hashes evicted since the last call.
func (p *blockPool) takeEvicted() []int64 {
	e := p.evicted
	p.evicted = p.evicted[:0]
	return e
}
