package kvindex

import (
	"strings"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// ApplyStats counts what Apply did with one batch.
type ApplyStats struct {
	StoredEvents      int  // BlockStored events applied
	StoredBlocks      int  // blocks added (device and other tiers)
	DuplicateBlocks   int  // blocks already held in that medium
	OffDeviceBlocks   int  // of StoredBlocks, those in a medium other than GPU
	RemovedEvents     int  // BlockRemoved events applied
	RemovedBlocks     int  // blocks removed
	UnknownRemoved    int  // removed hashes the worker did not hold in that medium (ignored)
	Cleared           int  // AllBlocksCleared events
	UnknownParent     int  // BlockStored events dropped: parent hash unknown
	BlockSizeMismatch int  // BlockStored events rejected: block size differs from the worker's
	EngineBlockSize   int  // the block size those rejected events carried (the last one's)
	Malformed         int  // BlockStored events whose token count is not blocks × block size
	IgnoredGroup      int  // events for a KV cache group other than 0
	UnknownWorker     bool // the worker is not registered; nothing was applied
}

// Add accumulates o into s.
func (s *ApplyStats) Add(o ApplyStats) {
	s.StoredEvents += o.StoredEvents
	s.StoredBlocks += o.StoredBlocks
	s.DuplicateBlocks += o.DuplicateBlocks
	s.OffDeviceBlocks += o.OffDeviceBlocks
	s.RemovedEvents += o.RemovedEvents
	s.RemovedBlocks += o.RemovedBlocks
	s.UnknownRemoved += o.UnknownRemoved
	s.Cleared += o.Cleared
	s.UnknownParent += o.UnknownParent
	s.BlockSizeMismatch += o.BlockSizeMismatch
	if o.EngineBlockSize > 0 {
		s.EngineBlockSize = o.EngineBlockSize
	}
	s.Malformed += o.Malformed
	s.IgnoredGroup += o.IgnoredGroup
	s.UnknownWorker = s.UnknownWorker || o.UnknownWorker
}

// Apply applies one batch from worker, event by event, in order:
//
//   - BlockStored chains its blocks from the router hash of its parent (an
//     engine hash the worker stored before) or, with no parent, from
//     Seed(model, lora_name, cache_salt), where cache_salt is read from the
//     first block's extra_keys. Blocks whose extra_keys name multimodal
//     items fold their identifiers in (HashBlocksMM, BlockMMKeys); extra
//     keys that are not in a shape vLLM ships count as Malformed. An unknown parent drops the event, counts
//     it and marks the worker stale, except integer 0, which llm-d's
//     simulator writes for "no parent" in the positional layout. A block size other than the worker's
//     is rejected and counted. Blocks in a medium other than GPU are
//     recorded but not matched.
//   - BlockRemoved drops the given engine hashes from that medium; hashes
//     the worker does not hold are counted and ignored.
//   - AllBlocksCleared purges the worker and clears its stale flag: from
//     here on the index is in step with the engine.
//
// Events of a KV cache group other than 0 (hybrid models' secondary
// groups) are counted and ignored. An unregistered worker changes nothing.
//
// The observer, if any, hears once per batch: CacheReset if the batch
// cleared the worker or made it stale, then BlocksStored with the device
// blocks stored after the last clear; and, with the lock released,
// AfterApply if it is an AfterApplier.
func (ix *Index) Apply(worker string, b vllmwire.EventBatch) ApplyStats {
	st, obs := ix.apply(worker, b)
	if a, ok := obs.(AfterApplier); ok {
		a.AfterApply()
	}
	return st
}

func (ix *Index) apply(worker string, b vllmwire.EventBatch) (ApplyStats, Observer) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var st ApplyStats
	w := ix.workers[worker]
	if w == nil {
		st.UnknownWorker = true
		return st, nil
	}
	wasStale := w.stale
	ix.stored, ix.removed = ix.stored[:0], ix.removed[:0]
	_, ix.wantRemoved = ix.obs.(RemovalObserver)
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case vllmwire.BlockStored:
			ix.applyStored(w, &e, &st)
		case *vllmwire.BlockStored:
			ix.applyStored(w, e, &st)
		case vllmwire.BlockRemoved:
			ix.applyRemoved(w, &e, &st)
		case *vllmwire.BlockRemoved:
			ix.applyRemoved(w, e, &st)
		case vllmwire.AllBlocksCleared, *vllmwire.AllBlocksCleared:
			ix.purge(w)
			w.stale = false
			st.Cleared++
			ix.stored, ix.removed = ix.stored[:0], ix.removed[:0]
		}
	}
	ix.sync(w)
	if ix.obs != nil {
		if st.Cleared > 0 || (w.stale && !wasStale) {
			ix.obs.CacheReset(worker)
		}
		if len(ix.stored) > 0 {
			ix.obs.BlocksStored(worker, ix.stored)
		}
		if len(ix.removed) > 0 && !w.stale {
			ix.obs.(RemovalObserver).BlocksRemoved(worker, ix.removed)
		}
	}
	return st, ix.obs
}

func otherGroup(g *int64) bool { return g != nil && *g != 0 }

// mediaBit returns 0 for the device tier, else the off-device bit. Names
// compare without case: connectors are not consistent about it.
func mediaBit(m *string) uint8 {
	switch {
	case m == nil || strings.EqualFold(*m, vllmwire.MediumGPU):
		return 0
	case strings.EqualFold(*m, vllmwire.MediumCPU):
		return mediaCPU
	}
	return mediaOther
}

func (ix *Index) applyStored(w *workerState, e *vllmwire.BlockStored, st *ApplyStats) {
	if otherGroup(e.GroupIdx) {
		st.IgnoredGroup++
		return
	}
	if e.BlockSize != w.blockSize {
		st.BlockSizeMismatch++
		st.EngineBlockSize = e.BlockSize
		return
	}
	if len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
		st.Malformed++
		return
	}
	lora := ""
	if e.LoraName != nil {
		lora = *e.LoraName
	}
	// A parent hash of integer 0 that the worker never stored is llm-d's
	// EmptyBlockHash: its positional layout (llm-d-inference-sim) writes 0,
	// not nil, for a chain that starts at the root.
	root := e.ParentBlockHash == nil
	var prev, parentAt uint64
	if !root {
		var ok bool
		if prev, parentAt, ok = w.router(ix.tab, e.ParentBlockHash.Key()); !ok {
			if v, isInt := e.ParentBlockHash.Int(); !isInt || v != 0 {
				st.UnknownParent++
				w.stale = true
				return
			}
			root = true
		}
	}
	var mmKeys [][]MMKey
	mmSalt := ""
	if e.ExtraKeys != nil {
		var err error
		mmKeys, mmSalt, err = BlockMMKeys(e.ExtraKeys, lora, len(e.BlockHashes), root)
		if err != nil {
			st.Malformed++
			return
		}
	}
	if root {
		salt := mmSalt
		if mmKeys == nil && e.ExtraKeys != nil {
			salt = cacheSalt(e.ExtraKeys, lora)
		}
		prev = w.seed
		if lora != "" || salt != "" {
			prev = Seed(w.model, lora, salt)
		}
	}
	ix.keys = engineKeys(e.BlockHashes, ix.keys[:0])
	medium := mediaBit(e.Medium)
	if medium == 0 {
		// The first keys' buckets load while the blocks are hashed.
		ix.prefetchKeys(w.device, 0)
	}
	ix.scratch = HashBlocksMM(prev, e.TokenIDs, e.BlockSize, mmKeys, ix.scratch[:0])
	t := ix.tab
	// at is the cell of the block before the next, whose cell is right
	// after it or starts a chain (chains.go).
	at, hasAt := parentAt, !root
	if medium == 0 {
		// One event's blocks that had equal holder sets share the result.
		t.begin(false)
		defer t.end()
	}
	for i, key := range ix.keys {
		r := ix.scratch[i]
		if medium == 0 && i > 0 {
			ix.prefetchKeys(w.device, i)
		}
		at, hasAt = t.place(r, at, hasAt, len(ix.keys)-i), true
		if medium != 0 {
			oe, ok := w.offDevice[key]
			if ok && oe.router == r && oe.media&medium != 0 {
				st.DuplicateBlocks++
				continue
			}
			if !ok || oe.router != r {
				t.pin(at) // before unpin: at may be a cell nothing holds yet
			}
			if ok && oe.router != r {
				w.countOff(oe.router, oe.media, -1)
				t.unpin(oe.at)
				oe = offEntry{}
			}
			w.countOff(r, medium&^oe.media, 1)
			w.offDevice[key] = offEntry{router: r, at: at, media: oe.media | medium}
			st.StoredBlocks++
			st.OffDeviceBlocks++
			continue
		}
		v, ok := w.device.slot(key) // hold and dropDevice leave w.device be
		var old uint64
		if ok {
			if old = *v; old == at {
				st.DuplicateBlocks++
				continue
			}
		}
		had := t.hold(at, w.idx)
		*v = at
		if ok {
			// The engine reused a hash for other content: the new block
			// wins. (After holding at: the drop may cut or free chains.)
			ix.dropDevice(w, old)
		}
		if had {
			w.dups[r]++
		} else {
			w.blocks++
		}
		st.StoredBlocks++
	}
	if medium == 0 && ix.obs != nil {
		ix.stored = append(ix.stored, ix.scratch...)
	}
	st.StoredEvents++
}

// router resolves an engine key of w in any medium to its router hash and
// the place of its cell.
func (w *workerState) router(t *chainTable, key uint64) (r, at uint64, ok bool) {
	if at, ok := w.device.get(key); ok {
		return t.cell(at).hash, at, true
	}
	if oe, ok := w.offDevice[key]; ok {
		return oe.router, oe.at, true
	}
	return 0, 0, false
}

// dropDevice removes one device holding by w, of the cell at, and reports
// whether w no longer holds that block at all.
func (ix *Index) dropDevice(w *workerState, at uint64) bool {
	t := ix.tab
	r := t.cell(at).hash
	if n := w.dups[r]; n > 0 {
		if n == 1 {
			delete(w.dups, r)
		} else {
			w.dups[r] = n - 1
		}
		t.release(at, w.idx, false)
		return false
	}
	t.release(at, w.idx, true)
	w.blocks--
	return true
}

func (ix *Index) applyRemoved(w *workerState, e *vllmwire.BlockRemoved, st *ApplyStats) {
	if otherGroup(e.GroupIdx) {
		st.IgnoredGroup++
		return
	}
	st.RemovedEvents++
	medium := mediaBit(e.Medium)
	ix.keys = engineKeys(e.BlockHashes, ix.keys[:0])
	if medium != 0 {
		for _, key := range ix.keys {
			oe, ok := w.offDevice[key]
			if !ok || oe.media&medium == 0 {
				st.UnknownRemoved++
				continue
			}
			w.countOff(oe.router, medium&oe.media, -1)
			if oe.media &^= medium; oe.media == 0 {
				delete(w.offDevice, key)
				ix.tab.unpin(oe.at)
			} else {
				w.offDevice[key] = oe
			}
			st.RemovedBlocks++
		}
		return
	}
	// Two passes: engine keys out of the worker's table (prefetched), then
	// the cells they held. A cell stays held until its own turn, so the
	// first drops free no cell the later ones need.
	cells := ix.scratch[:0]
	for i, key := range ix.keys {
		ix.prefetchKeys(w.device, i)
		at, ok := w.device.remove(key)
		if !ok {
			st.UnknownRemoved++
			continue
		}
		cells = append(cells, at)
	}
	t := ix.tab
	ix.sink ^= t.touchCells(cells)
	t.begin(false)
	for _, at := range cells {
		r := t.cell(at).hash
		if ix.dropDevice(w, at) && ix.wantRemoved {
			ix.removed = append(ix.removed, r)
		}
	}
	t.end()
	st.RemovedBlocks += len(cells)
	ix.scratch = cells
}

// prefetchAhead is how far ahead of the engine key being applied the
// worker's table is prefetched: enough keys to cover a cache miss, few
// enough to be in flight together (prefetching a whole event's keys at
// once measured slower).
const prefetchAhead = 16

// prefetchKeys, called for every i in order, prefetches the home buckets
// of ix.keys in chunks, a chunk ahead of i.
func (ix *Index) prefetchKeys(t *u64Table, i int) {
	if i%prefetchAhead != 0 {
		return
	}
	lo := i + prefetchAhead
	if i == 0 {
		lo = 0
	}
	if hi := min(i+2*prefetchAhead, len(ix.keys)); lo < hi {
		ix.at = t.prefetch(ix.keys[lo:hi], ix.at)
	}
}

func engineKeys(hs []vllmwire.EngineHash, dst []uint64) []uint64 {
	for _, h := range hs {
		dst = append(dst, h.Key())
	}
	return dst
}
