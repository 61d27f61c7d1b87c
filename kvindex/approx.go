package kvindex

import (
	"sync"
	"time"
)

// Approx defaults.
const (
	DefaultApproxTTL       = 120 * time.Second
	DefaultApproxMaxBlocks = 1 << 20
	DefaultApproxPruneTo   = 0.8
)

// ApproxConfig tunes an Approx. The zero value gives the defaults.
type ApproxConfig struct {
	TTL       time.Duration    // how long a recorded block is believed; default 120 s
	MaxBlocks int              // (block, worker) pairs kept; default 2^20
	PruneTo   float64          // fraction of MaxBlocks kept after a prune; default 0.8
	Now       func() time.Time // clock; default time.Now
}

// Approx is the index for fleets that publish no KV events: it believes that
// a worker holds the blocks of every prompt the router sent it, for a TTL.
// When it outgrows MaxBlocks it prunes to PruneTo × MaxBlocks, dropping the
// oldest records first and, within a record, its deepest blocks first, so
// what survives is still a prefix. Safe for concurrent use.
type Approx struct {
	mu      sync.RWMutex
	cfg     ApproxConfig
	workers map[string]*apxWorker
	slots   []*apxWorker
	tab     *holderTable
	queue   []apxRecord // oldest first, from head
	head    int
	seq     uint64
	size    int
	gen     uint64 // bumped when a worker is added or removed
	cands   candidateCache
}

type apxWorker struct {
	id  string
	idx int // slot in Approx.slots and in holder sets
	// held maps each block hash to the sequence number of the newest
	// record that holds it; an older record no longer owns the block.
	held map[uint64]uint64
}

type apxRecord struct {
	seq    uint64
	at     time.Time
	worker *apxWorker
	hashes []uint64
}

// NewApprox returns an empty approximate index.
func NewApprox(cfg ApproxConfig) *Approx {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultApproxTTL
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultApproxMaxBlocks
	}
	if cfg.PruneTo <= 0 || cfg.PruneTo > 1 {
		cfg.PruneTo = DefaultApproxPruneTo
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Approx{cfg: cfg, workers: map[string]*apxWorker{}, tab: newHolderTable(0)}
}

// Record notes that the router sent a prompt with these block hashes to
// worker, which will therefore hold them (newest first to be kept).
func (a *Approx) Record(worker string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expire(now)
	w := a.worker(worker)
	a.seq++
	a.tab.begin(false) // the prompt's blocks that had equal sets share the result
	for _, h := range hashes {
		if _, ok := w.held[h]; !ok {
			a.size++
			a.tab.add(h, w.idx)
		}
		w.held[h] = a.seq
	}
	a.tab.end()
	a.queue = append(a.queue, apxRecord{seq: a.seq, at: now, worker: w, hashes: append([]uint64(nil), hashes...)})
	if a.size > a.cfg.MaxBlocks {
		a.prune(int(float64(a.cfg.MaxBlocks) * a.cfg.PruneTo))
	}
}

func (a *Approx) worker(id string) *apxWorker {
	if w := a.workers[id]; w != nil {
		return w
	}
	idx := 0
	for idx < len(a.slots) && a.slots[idx] != nil {
		idx++
	}
	if idx == len(a.slots) {
		a.slots = append(a.slots, nil)
	}
	w := &apxWorker{id: id, idx: idx, held: map[uint64]uint64{}}
	a.slots[idx] = w
	a.workers[id] = w
	a.gen++
	return w
}

// slotOf returns the slot of worker id, or -1.
func (a *Approx) slotOf(id string) int32 {
	if w := a.workers[id]; w != nil {
		return int32(w.idx)
	}
	return -1
}

// expire drops records older than the TTL. Caller holds the write lock.
func (a *Approx) expire(now time.Time) {
	for a.head < len(a.queue) && !now.Before(a.queue[a.head].at.Add(a.cfg.TTL)) {
		a.dropFrom(&a.queue[a.head], 0)
		a.pop()
	}
}

func (a *Approx) headExpired(now time.Time) bool {
	return a.head < len(a.queue) && !now.Before(a.queue[a.head].at.Add(a.cfg.TTL))
}

// prune drops oldest records, deepest blocks first, until size <= target.
func (a *Approx) prune(target int) {
	for a.size > target && a.head < len(a.queue) {
		rec := &a.queue[a.head]
		for i := len(rec.hashes) - 1; i >= 0 && a.size > target; i-- {
			a.dropFrom(rec, i)
			rec.hashes = rec.hashes[:i]
		}
		if len(rec.hashes) == 0 {
			a.pop()
		}
	}
}

// dropFrom removes the blocks rec still owns from position i on.
func (a *Approx) dropFrom(rec *apxRecord, i int) {
	w := rec.worker
	if w.held == nil {
		return // the worker was removed
	}
	a.tab.begin(false)
	for _, h := range rec.hashes[i:] {
		if w.held[h] == rec.seq {
			delete(w.held, h)
			a.tab.remove(h, w.idx)
			a.size--
		}
	}
	a.tab.end()
}

func (a *Approx) pop() {
	a.queue[a.head] = apxRecord{}
	a.head++
	if a.head > 1024 && a.head*2 > len(a.queue) {
		a.queue = append(a.queue[:0], a.queue[a.head:]...)
		a.head = 0
	}
}

// RemoveWorker forgets worker's records.
func (a *Approx) RemoveWorker(worker string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.workers[worker]
	if w == nil {
		return
	}
	a.tab.begin(true)
	for h := range w.held {
		a.tab.remove(h, w.idx)
	}
	a.tab.end()
	a.size -= len(w.held)
	w.held = nil // records still queued see a removed worker
	delete(a.workers, worker)
	a.gen++
	a.slots[w.idx] = nil
}

// Len returns the number of (block, worker) pairs held.
func (a *Approx) Len() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.size
}

// Match implements Matcher. Blocks older than the TTL are not matched.
func (a *Approx) Match(hashes []uint64, candidates []string, out []MatchResult) []MatchResult {
	now := a.cfg.Now()
	a.mu.RLock()
	if a.headExpired(now) {
		a.mu.RUnlock()
		a.mu.Lock()
		a.expire(now)
		a.mu.Unlock()
		a.mu.RLock()
	}
	defer a.mu.RUnlock()
	var bufs matchBufs
	slots := a.cands.resolve(a.gen, len(a.slots), candidates, a.slotOf).slots
	walked := bufs.mask(len(a.slots))
	for _, s := range slots {
		if s >= 0 {
			walked[s>>6] |= 1 << (s & 63)
		}
	}
	depth := matchSlots(a.tab, len(a.slots), hashes, walked, &bufs)
	out = resize(out, len(slots))
	for i, s := range slots {
		if s < 0 {
			out[i].reset(false, false, 0, 0)
			continue
		}
		out[i].reset(true, false, len(a.slots[s].held), int(depth[s]))
	}
	bufs.release()
	return out
}
