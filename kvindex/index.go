package kvindex

import (
	"sync"
	"unsafe"
)

// Config tunes an Index. The zero value works.
type Config struct {
	// InitialBlocks pre-sizes the block table (distinct router hashes).
	InitialBlocks int
	// JumpSearch is kept so that configurations naming it still build; it
	// changes nothing. (It made Match stride through long prompts; the
	// chains that Match walks now read those in order.)
	JumpSearch bool
}

// Index is the concurrent prefix index fed by KV events: for every router
// block hash, which workers hold it on the device tier. Any number of
// goroutines may call Match while others Apply batches.
//
// Workers get dense slot numbers. One chainTable maps every distinct
// router hash to the set of slots holding it (up to four inline in 64
// bits, more as a bitset beside the table), kept in chains of cells in the
// order blocks were stored after their parents, so a lookup probes the
// table once per chain a prompt crosses and reads the rest in order,
// whatever the size of the fleet, and costs memory per distinct block
// rather than per worker.
type Index struct {
	mu          sync.RWMutex
	cfg         Config
	workers     map[string]*workerState
	slots       []*workerState   // by dense index; nil when free
	hot         []workerHot      // by dense index: what Match reads of each worker
	tab         *chainTable      // router hash -> slots of the workers holding it
	scratch     []uint64         // router hashes of the event being applied
	keys        []uint64         // engine keys of the event being applied
	at          []unsafe.Pointer // tags and slots being prefetched for the event being applied
	sink        uint64           // keeps prefetching loads alive
	gen         uint64           // bumped when a worker is added or removed
	cands       candidateCache
	results     templateCache // the last candidate list's results (results.go)
	nOff        int           // workers whose hot entry says off
	obs         Observer      // nil: none
	stored      []uint64      // device blocks stored by the batch being applied, for obs
	removed     []uint64      // device blocks the batch took off the worker, for a RemovalObserver
	wantRemoved bool          // obs is a RemovalObserver: fill removed
}

// Observer learns from the index what state kept beside it must follow:
// the scheduler's pending overlay (scoring.Pool) drops a block once a
// worker's events report it stored, and everything about a worker whose
// view is purged or goes stale. Its methods are called with the index's
// lock held, so they must be quick and must not call the Index.
type Observer interface {
	// BlocksStored: worker stored these router hashes on the device tier.
	// hashes is only valid during the call.
	BlocksStored(worker string, hashes []uint64)
	// CacheReset: worker's blocks were cleared (AllBlocksCleared, Reset, a
	// change of model or block size, removal) or its view went stale.
	CacheReset(worker string)
}

// RemovalObserver is an Observer that also hears which device blocks a
// batch took off a worker: BlocksRemoved runs after BlocksStored, once per
// batch that removed any, with the router hashes the worker no longer
// holds (hashes is only valid during the call). A block removed and stored
// again in the same batch may be named.
type RemovalObserver interface {
	BlocksRemoved(worker string, hashes []uint64)
}

// AfterApplier is an Observer that also hears, once Apply has released the
// index's lock, that a batch was applied: what it must not do under the
// lock (wake waiters whose picks call the Index) it does then.
type AfterApplier interface {
	AfterApply()
}

// SetObserver sets the index's observer; nil removes it.
func (ix *Index) SetObserver(o Observer) {
	ix.mu.Lock()
	ix.obs = o
	ix.mu.Unlock()
}

// reset tells the observer that w's view was purged or went stale. Caller
// holds mu.
func (ix *Index) reset(w *workerState) {
	if ix.obs != nil {
		ix.obs.CacheReset(w.id)
	}
}

// workerState is one worker's view. Guarded by Index.mu.
type workerState struct {
	id, model string
	blockSize int
	idx       int // slot in Index.slots and in holder sets
	// device maps each device-tier engine hash key to the place of its
	// block's cell (chains.go), which holds the router hash.
	device *u64Table
	// capacity is the device table's reservation (Reserve), in blocks.
	capacity int
	// offDevice holds blocks stored in other media (CPU, disk): engine key
	// to router hash, the place of its cell and a bitmask of media.
	offDevice map[uint64]offEntry
	// offRouter counts, per router hash, the off-device engine keys that
	// hold it in each medium ([0] CPU, [1] other), for tier matching.
	offRouter map[uint64][2]uint32
	// dups counts, per router hash, device engine keys beyond the first
	// that map to it (e.g. multimodal prompts with equal placeholder
	// tokens), so one removal does not clear a block still held.
	dups   map[uint64]uint32
	blocks int // distinct router hashes whose bit is set
	// seed is Seed(model, "", ""), the root of chains without LoRA or salt.
	seed  uint64
	stale bool
}

// workerHot is what Match reads of a worker besides where its bit lives,
// kept in one dense array so that a Match over a large fleet reads a few
// bytes per worker instead of several cache lines of its state. sync
// refreshes it, under the write lock, after anything that may change it.
type workerHot struct {
	blocks int  // workerState.blocks
	stale  bool // workerState.stale
	off    bool // the worker holds blocks off the device
}

// sync refreshes w's hot entry. Caller holds mu for writing.
func (ix *Index) sync(w *workerState) {
	ix.setHot(w.idx, workerHot{blocks: w.blocks, stale: w.stale, off: len(w.offRouter) > 0})
}

// setHot sets slot's hot entry and keeps the count of offloading workers.
// Caller holds mu for writing.
func (ix *Index) setHot(slot int, h workerHot) {
	old := &ix.hot[slot]
	ix.nOff += b2i(h.off) - b2i(old.off)
	*old = h
	ix.results.update(slot, h)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

type offEntry struct {
	router uint64
	at     uint64 // the place of its cell, which the entry pins
	media  uint8
}

const (
	mediaCPU   uint8 = 1
	mediaOther uint8 = 2
)

// New returns an empty index.
func New(cfg Config) *Index {
	return &Index{cfg: cfg, workers: map[string]*workerState{}, tab: newChainTable(cfg.InitialBlocks)}
}

// AddWorker registers a worker, its model (the seed of its hash chains) and
// its KV block size. Adding a known worker with a different model or block
// size purges its blocks; the same values change nothing.
func (ix *Index) AddWorker(id, model string, blockSize int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if w := ix.workers[id]; w != nil {
		if w.model != model || w.blockSize != blockSize {
			ix.purge(w)
			w.model, w.blockSize, w.seed = model, blockSize, Seed(model, "", "")
			w.stale = false
			ix.reset(w)
			ix.sync(w)
		}
		return
	}
	idx := 0
	for idx < len(ix.slots) && ix.slots[idx] != nil {
		idx++
	}
	if idx == len(ix.slots) {
		ix.slots = append(ix.slots, nil)
		ix.hot = append(ix.hot, workerHot{})
	}
	w := &workerState{
		id: id, model: model, blockSize: blockSize, seed: Seed(model, "", ""),
		idx:       idx,
		device:    newU64Table(),
		offDevice: map[uint64]offEntry{},
		offRouter: map[uint64][2]uint32{},
		dups:      map[uint64]uint32{},
	}
	ix.slots[idx] = w
	ix.workers[id] = w
	ix.sync(w)
	ix.gen++
}

// MaxReserveBlocks bounds Reserve: 2^20 blocks (16M tokens in 16-token
// blocks) is more KV cache than one engine rank holds today, and about
// 36 MB of table.
const MaxReserveBlocks = 1 << 20

// Reserve tells the index that worker's engine caches up to blocks KV
// blocks on the device (vLLM's num_gpu_blocks), so that its table of the
// worker's blocks is sized for them once, instead of growing while the
// cache fills: a table holding fewer slots is rebuilt to that size, and no
// longer shrinks below it when the cache empties. A larger table is kept.
// blocks beyond MaxReserveBlocks count as MaxReserveBlocks; 0 or less, and
// an unregistered worker, change nothing. Calling it again with the same
// capacity costs a read lock.
func (ix *Index) Reserve(worker string, blocks int) {
	blocks = min(blocks, MaxReserveBlocks)
	if blocks <= 0 {
		return
	}
	ix.mu.RLock()
	w := ix.workers[worker]
	same := w == nil || w.capacity == blocks
	ix.mu.RUnlock()
	if same {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if w := ix.workers[worker]; w != nil && w.capacity != blocks {
		w.capacity = blocks
		w.device.reserve(blocks)
	}
}

// Capacity returns the capacity Reserve last gave worker's table, in
// blocks (0: none).
func (ix *Index) Capacity(worker string) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if w := ix.workers[worker]; w != nil {
		return w.capacity
	}
	return 0
}

// RemoveWorker forgets a worker and every block it held.
func (ix *Index) RemoveWorker(id string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w := ix.workers[id]
	if w == nil {
		return
	}
	ix.purge(w)
	ix.reset(w)
	delete(ix.workers, id)
	ix.gen++
	ix.slots[w.idx] = nil
	ix.setHot(w.idx, workerHot{})
}

// HasWorker reports whether id is registered.
func (ix *Index) HasWorker(id string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.workers[id] != nil
}

// purge drops every block of w. Caller holds mu.
func (ix *Index) purge(w *workerState) {
	ix.tab.begin(true)
	w.device.each(func(_, at uint64) { ix.dropDevice(w, at) })
	for _, oe := range w.offDevice {
		ix.tab.unpin(oe.at)
	}
	ix.tab.end()
	w.device = newU64TableFor(w.capacity)
	w.offDevice = map[uint64]offEntry{}
	w.offRouter = map[uint64][2]uint32{}
	w.dups = map[uint64]uint32{}
	w.blocks = 0
}

// NeedsResync reports whether worker's view is stale: a sequence gap or
// restart, or an event whose parent was unknown, happened since the last
// AllBlocksCleared or Reset.
func (ix *Index) NeedsResync(worker string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	w := ix.workers[worker]
	return w != nil && w.stale
}

// MarkStale flags worker as needing a resync.
func (ix *Index) MarkStale(worker string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if w := ix.workers[worker]; w != nil {
		w.stale = true
		ix.reset(w)
		ix.sync(w)
	}
}

// Reset purges worker's blocks and clears its stale flag, as when its
// event stream starts afresh.
func (ix *Index) Reset(worker string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if w := ix.workers[worker]; w != nil {
		ix.purge(w)
		w.stale = false
		ix.reset(w)
		ix.sync(w)
	}
}

// Match implements Matcher: per candidate, the consecutive leading blocks
// of hashes it holds on the device tier. hashes are a prompt's, from its
// first block on, as HashBlocks returns them: the index finds a block from
// its parent's (chains.go), so hashes that start in the middle of a prompt
// may match nothing. It walks the prompt once for all candidates and stops
// as soon as none of them holds the next block. For
// workers that report offloaded blocks it then counts the blocks right
// after the device prefix held in host memory (HostBlocks) and, after
// those, on other media such as disk (DiskBlocks).
func (ix *Index) Match(hashes []uint64, candidates []string, out []MatchResult) []MatchResult {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var bufs matchBufs
	walked := bufs.mask(len(ix.slots))
	rc := ix.cands.resolve(ix.gen, len(ix.slots), candidates, ix.slotOf)
	slots := rc.slots
	tmpl := ix.results.get(rc, ix.hot)
	if tmpl.dup {
		tmpl = nil
	}
	copy(walked, rc.mask) // the walk changes it
	// On a large fleet the walk lists the candidates it found any blocks
	// for, so that the template's results need not be looked through.
	depth, touched := matchChains(ix.tab, len(ix.slots), hashes, walked, &bufs, tmpl != nil && len(ix.slots) > len(bufs.depth1))
	out = resize(out, len(slots))
	if tmpl != nil {
		tmpl.fill(out, depth, touched)
	} else {
		fillResults(out, slots, ix.hot, depth)
	}
	if ix.nOff > 0 {
		for i, s := range slots {
			if s >= 0 && ix.hot[s].off {
				h, d := ix.slots[s].offTiers(hashes[out[i].Blocks:])
				out[i].HostBlocks, out[i].DiskBlocks = int32(h), int32(d)
			}
		}
	}
	bufs.release() // after the last use of depth, which may be pooled
	return out
}

// fillResults writes each candidate's result: a loop of its own, with
// everything it reads in locals, so that on 1,000 candidates the compiler
// keeps them in registers instead of reloading them from the Index after
// every store to out.
func fillResults(out []MatchResult, slots []int32, hot []workerHot, depth []int32) {
	out = out[:len(slots)]
	for i, s := range slots {
		if s < 0 {
			out[i].reset(false, false, 0, 0)
			continue
		}
		h := &hot[s]
		out[i].reset(true, h.stale, h.blocks, int(depth[s]))
	}
}

// slotOf returns the slot of worker id, or -1.
func (ix *Index) slotOf(id string) int32 {
	if w := ix.workers[id]; w != nil {
		return int32(w.idx)
	}
	return -1
}

// offTiers counts the leading hashes held in host memory, then the ones
// after those held on other media.
func (w *workerState) offTiers(hashes []uint64) (host, disk int) {
	for host < len(hashes) && w.offRouter[hashes[host]][0] > 0 {
		host++
	}
	for host+disk < len(hashes) {
		c := w.offRouter[hashes[host+disk]]
		if c[0] == 0 && c[1] == 0 {
			break
		}
		disk++
	}
	return host, disk
}

// countOff adds d to router hash r's off-device holdings in the media of
// mask.
func (w *workerState) countOff(r uint64, mask uint8, d int) {
	c := w.offRouter[r]
	if mask&mediaCPU != 0 {
		c[0] = uint32(int(c[0]) + d)
	}
	if mask&mediaOther != 0 {
		c[1] = uint32(int(c[1]) + d)
	}
	if c == [2]uint32{} {
		delete(w.offRouter, r)
	} else {
		w.offRouter[r] = c
	}
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Stats is a snapshot of the index's size.
type Stats struct {
	Workers   int
	Blocks    int // rows of the block table: distinct router hashes held on the device tier
	Entries   int // (block, worker) pairs on the device tier
	Bytes     int // approximate memory of the block table and engine-hash maps
	PerWorker []WorkerStats
}

// WorkerStats is one worker's part of Stats.
type WorkerStats struct {
	ID              string `json:"id"`
	Model           string `json:"model"`
	BlockSize       int    `json:"block_size"`
	Blocks          int    `json:"blocks"`            // device blocks
	OffDeviceBlocks int    `json:"off_device_blocks"` // engine hashes held in other media (CPU, disk)
	Stale           bool   `json:"stale"`
}

// Stats returns a snapshot of the index's size, workers in index order.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := Stats{Workers: len(ix.workers)}
	s.Blocks = ix.tab.held
	s.Bytes = ix.tab.bytes()
	for _, w := range ix.slots {
		if w == nil {
			continue
		}
		s.Entries += w.blocks
		s.Bytes += w.device.bytes() + len(w.offDevice)*40
		s.PerWorker = append(s.PerWorker, WorkerStats{
			ID: w.id, Model: w.model, BlockSize: w.blockSize,
			Blocks: w.blocks, OffDeviceBlocks: len(w.offDevice), Stale: w.stale,
		})
	}
	return s
}
