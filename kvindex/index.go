package kvindex

import (
	"sync"
)

// Config tunes an Index. The zero value works.
type Config struct {
	// InitialBlocks pre-sizes the block table (distinct router hashes).
	InitialBlocks int
}

// Index is the concurrent prefix index fed by KV events: for every router
// block hash, which workers hold it on the device tier. Any number of
// goroutines may call Match while others Apply batches.
type Index struct {
	mu      sync.RWMutex
	cfg     Config
	workers map[string]*workerState
}

type workerState struct {
	id, model string
	blockSize int
	stale     bool
}

// New returns an empty index.
func New(cfg Config) *Index {
	return &Index{cfg: cfg, workers: map[string]*workerState{}}
}

// AddWorker registers a worker, its model (the seed of its hash chains) and
// its KV block size. Adding a known worker with a different model or block
// size purges its blocks; the same values change nothing.
func (ix *Index) AddWorker(id, model string, blockSize int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.workers[id] = &workerState{id: id, model: model, blockSize: blockSize}
}

// RemoveWorker forgets a worker and every block it held.
func (ix *Index) RemoveWorker(id string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	delete(ix.workers, id)
}

// HasWorker reports whether id is registered.
func (ix *Index) HasWorker(id string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.workers[id] != nil
}

// ApplyStats counts what Apply did with one batch.
type ApplyStats struct {
	StoredEvents      int // BlockStored events applied
	StoredBlocks      int // blocks added (device and other tiers)
	DuplicateBlocks   int // blocks already held in that medium
	OffDeviceBlocks   int // blocks stored in a medium other than GPU
	RemovedEvents     int // BlockRemoved events applied
	RemovedBlocks     int // blocks removed
	UnknownRemoved    int // removed hashes the worker never stored (ignored)
	Cleared           int // AllBlocksCleared events
	UnknownParent     int // BlockStored events dropped: parent hash unknown
	BlockSizeMismatch int // BlockStored events rejected: block size differs from the worker's
	Malformed         int // BlockStored events whose token count is not blocks × block size
	IgnoredGroup      int // events for a KV cache group other than 0
	UnknownWorker     bool
}

// Apply applies one batch from worker, in order. See the package README for
// the semantics of each event.
func (ix *Index) Apply(worker string, b EventBatch) ApplyStats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.workers[worker] == nil {
		return ApplyStats{UnknownWorker: true}
	}
	return ApplyStats{}
}

// NeedsResync reports whether worker's view is stale: a sequence gap or
// restart, or an event whose parent was unknown, happened since the last
// AllBlocksCleared or fresh stream.
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
	}
}

// Reset purges worker's blocks and clears its stale flag, as when its
// event stream starts afresh.
func (ix *Index) Reset(worker string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if w := ix.workers[worker]; w != nil {
		w.stale = false
	}
}

// Match implements Matcher.
func (ix *Index) Match(hashes []uint64, candidates []string, out []MatchResult) []MatchResult {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out = out[:0]
	for _, c := range candidates {
		w := ix.workers[c]
		out = append(out, MatchResult{Worker: c, Known: w != nil, Stale: w != nil && w.stale})
	}
	return out
}

// Stats is a snapshot of the index's size.
type Stats struct {
	Workers   int
	Blocks    int // distinct router hashes held on the device tier
	Entries   int // (block, worker) pairs on the device tier
	PerWorker []WorkerStats
}

// WorkerStats is one worker's part of Stats.
type WorkerStats struct {
	ID              string
	Model           string
	BlockSize       int
	Blocks          int // device blocks
	OffDeviceBlocks int // blocks held only in other media (CPU, disk)
	Stale           bool
}

// Stats returns a snapshot of the index's size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := Stats{Workers: len(ix.workers)}
	for _, w := range ix.workers {
		s.PerWorker = append(s.PerWorker, WorkerStats{ID: w.id, Model: w.model, BlockSize: w.blockSize, Stale: w.stale})
	}
	return s
}
