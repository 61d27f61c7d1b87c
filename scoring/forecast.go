package scoring

// The eviction forecast. A prompt's cached prefix on a worker is a hit
// only if it is still there when the request runs, and a request that
// waits behind other prefills runs after they have allocated their blocks.
// Engines allocate from a free queue in least-recently-used order (vLLM's
// free block queue): a request's blocks join its tail when it ends,
// deepest first; an allocation takes the block at its head, evicting what
// that block cached; a hit takes its blocks out of the middle until the
// request ends. A decision that counted a prefix as cached that the
// allocations queued ahead will evict sends a request to a worker that
// will compute it again, behind a queue it was not charged for.
//
// The pool keeps, per worker, a shadow of that queue at the grain of
// requests (freeQueue): a segment per ended request, in the order they
// ended, after the blocks that were free before any (untracked). What the
// pool sees moves it:
//
//   - a request's end appends its blocks as a segment, and stamps its
//     deepest prompt block, the deepest block of the hit it was sent for
//     and every 16th prompt block with their segment and place in it
//     (recency);
//   - the blocks the worker's events report stored are allocations: they
//     come off the head;
//   - a request sent for a hit takes the hit's blocks out of the segment
//     its deepest block's stamp names (from that block to the root);
//   - an eviction the events report of a stamped block puts the head at
//     that block: the shadow follows the engine whenever it has drifted
//     (allocations the events did not show, blocks another router's
//     requests freed).
//
// allocDue is the value the worker's stored count will reach once the
// prefills sent to it have allocated their uncached blocks, so allocDue −
// stored is the allocations queued ahead of a new request. A candidate
// whose matched prefix ends on a block that no active request holds, and
// whose place in the shadow is known, loses, deepest first, as many
// blocks as those allocations reach past that place: its overlap shrinks
// by them, so its uncached tokens, its predicted time and the
// duplicate-prefill term (which compares holders' prefixes) all see the
// loss. The forecast reads only the worker's own state under the pool's
// lock, so the full and the pruned decision make the same one.

// recencyStamp is where a prompt block stands in its worker's shadow free
// queue: the segment of the request that freed it last and its place in
// it, counted from the segment's deepest block.
type recencyStamp struct {
	seg uint64
	off int32
}

// freeSegment is one ended request's blocks in the shadow free queue.
type freeSegment struct {
	// blocks is the request's blocks, prompt and output, when it ended.
	blocks int32
	// popped blocks are gone from its deepest end (allocations), removed
	// blocks from its root end (hits).
	popped, removed int32
}

func (s *freeSegment) alive() int32 { return max(s.blocks-s.popped-s.removed, 0) }

// freeQueue is a worker's shadow free queue. The zero value is not yet
// started: start seeds it with the worker's capacity.
type freeQueue struct {
	started bool
	// untracked is the free blocks ahead of every segment.
	untracked int64
	// segs are the live segments, oldest first; segs[i] has id base+i.
	segs []freeSegment
	base uint64
	// alive is untracked plus every segment's alive blocks.
	alive int64
}

// maxFreeSegments bounds the shadow: segments past it merge into the
// untracked blocks, oldest first. Stamps are bounded by stampLimit.
const maxFreeSegments = 1 << 12

// stampStride: besides a request's deepest prompt block and the deepest
// block of its hit, every stampStride-th prompt block is stamped, so that
// a later prompt that parts from this one between two of those still
// finds a stamp at most stampStride−1 blocks above its matched prefix's
// end.
const stampStride = 16

// start seeds an unstarted queue with capacity free blocks.
func (q *freeQueue) start(capacity int) {
	if q.started || capacity <= 0 {
		return
	}
	q.started = true
	q.untracked, q.alive = int64(capacity), int64(capacity)
}

// reset empties the queue into capacity untracked free blocks: the
// engine's cache was cleared.
func (q *freeQueue) reset(capacity int) {
	q.base += uint64(len(q.segs))
	q.segs = q.segs[:0]
	q.started = false
	q.untracked, q.alive = 0, 0
	q.start(capacity)
}

// dropHead drops the oldest segment.
func (q *freeQueue) dropHead() {
	q.alive -= int64(q.segs[0].alive())
	q.segs = q.segs[1:]
	q.base++
	if cap(q.segs) > 64 && len(q.segs) < cap(q.segs)/4 {
		q.segs = append([]freeSegment(nil), q.segs...)
	}
}

// pop takes n blocks off the head.
func (q *freeQueue) pop(n int64) {
	take := min(n, q.untracked)
	q.untracked -= take
	q.alive -= take
	n -= take
	for n > 0 && len(q.segs) > 0 {
		s := &q.segs[0]
		if a := int64(s.alive()); a > n {
			s.popped += int32(n)
			q.alive -= n
			return
		} else {
			n -= a
		}
		q.dropHead()
	}
}

// push appends an ended request's blocks and returns their segment's id.
// The queue never holds more than capacity blocks: what is beyond it was
// allocated unseen, from the head.
func (q *freeQueue) push(blocks, capacity int) uint64 {
	if len(q.segs) >= maxFreeSegments {
		s := q.segs[0]
		a := int64(s.alive())
		q.dropHead()
		q.untracked += a
		q.alive += a
	}
	q.segs = append(q.segs, freeSegment{blocks: int32(blocks)})
	q.alive += int64(blocks)
	if over := q.alive - int64(capacity); capacity > 0 && over > 0 {
		q.pop(over)
	}
	return q.base + uint64(len(q.segs)-1)
}

// segment returns the live segment id, or nil.
func (q *freeQueue) segment(id uint64) *freeSegment {
	if id < q.base || id-q.base >= uint64(len(q.segs)) {
		return nil
	}
	return &q.segs[id-q.base]
}

// place is how many free blocks are ahead of the block at st, and whether
// the block is in the queue by the shadow's count. A block the shadow has
// already allocated, which the caller knows is still cached, is at the
// head: the shadow ran ahead of the engine.
func (q *freeQueue) place(st recencyStamp) (int64, bool) {
	if st.seg < q.base {
		return 0, true
	}
	s := q.segment(st.seg)
	if s == nil || st.off >= s.blocks-s.removed {
		return 0, false
	}
	if st.off < s.popped {
		return 0, true
	}
	ahead := q.untracked
	for i := range q.segs[:st.seg-q.base] {
		ahead += int64(q.segs[i].alive())
	}
	return ahead + int64(st.off-s.popped), true
}

// stampOf resolves the stamp of a prompt's block matched−1: its own, or
// the stride stamp above it, whose request freed the blocks after it down
// to this one just before it.
func (w *worker) stampOf(hashes []uint64, matched int) (recencyStamp, bool) {
	if st, ok := w.recency[hashes[matched-1]]; ok {
		return st, true
	}
	j := matched/stampStride*stampStride - 1
	if j < 0 {
		return recencyStamp{}, false
	}
	st, ok := w.recency[hashes[j]]
	if !ok {
		return recencyStamp{}, false
	}
	st.off -= int32(matched - 1 - j)
	return st, st.off >= 0
}

// queuedAllocations is the blocks the prefills sent to w will still
// allocate, as far as its events have not reported them stored.
func (w *worker) queuedAllocations() int64 {
	if w.allocDue > w.stored {
		return int64(w.allocDue - w.stored)
	}
	return 0
}

// forecastLossLocked is how many of the prompt's first matched blocks on w
// the allocations queued ahead of it would evict before it runs.
func (p *Pool) forecastLossLocked(w *worker, hashes []uint64, matched int) int {
	// Most candidates match nothing or have nothing queued: they cost
	// no more than a read of the worker's hot fields.
	if matched <= 0 || matched > len(hashes) {
		return 0
	}
	n := w.queuedAllocations()
	if n <= 0 || len(w.recency) == 0 || w.blockRefs.count(hashes[matched-1]) > 0 {
		// Nothing queued, or in use by an active request.
		return 0
	}
	st, ok := w.stampOf(hashes, matched)
	if !ok {
		return 0
	}
	pos, ok := w.free.place(st)
	if !ok || n <= pos {
		return 0
	}
	return int(min(n-pos, int64(matched)))
}

// capacityLocked is w's KV capacity in blocks: its fresh report's, or its
// spec's.
func (p *Pool) capacityLocked(w *worker, now int64) int {
	if w.hasReport && w.report.KVTotalBlocks > 0 && now-w.reportAt.UnixNano() <= int64(p.opts.StaleReportAge) {
		return w.report.KVTotalBlocks
	}
	return w.kvTotalBlocks
}

// freedLocked appends a's blocks to its worker's shadow free queue as a
// ends, and stamps its deepest prompt block, the deepest block of its hit
// and every stampStride-th.
func (p *Pool) freedLocked(a *active, now int64) {
	w := a.w
	if p.opts.NoEvictionForecast || len(a.hashes) == 0 || a.prefillTokens > 0 {
		// A request that ends before its first token never held its
		// prompt: the blocks it had begun to allocate are not known.
		return
	}
	capacity := p.capacityLocked(w, now)
	if capacity <= 0 {
		return
	}
	w.free.start(capacity)
	total := max(blocksFor(a.promptTokens+a.outputTokens, w.blockSize), len(a.hashes))
	seg := w.free.push(total, capacity)
	if w.recency == nil {
		w.recency = make(map[uint64]recencyStamp)
	} else if limit := w.stampLimit(capacity); len(w.recency)+len(a.hashes)/stampStride+2 > limit {
		w.pruneStamps(limit / 2)
	}
	// The blocks join the queue deepest first: block j has the
	// request's blocks after it ahead of it in its segment.
	stamp := func(j int) {
		w.recency[a.hashes[j]] = recencyStamp{seg: seg, off: int32(total - 1 - j)}
	}
	for j := stampStride - 1; j < len(a.hashes)-1; j += stampStride {
		stamp(j)
	}
	stamp(len(a.hashes) - 1)
	if m := a.matched; m > 0 && m < len(a.hashes) {
		stamp(m - 1)
	}
}

// hitLocked takes the first matched blocks of hashes, which a request just
// sent to w counted as held, out of w's shadow free queue: the engine
// holds them for the request until it ends. Call it before the request's
// blocks count as in use.
func (p *Pool) hitLocked(w *worker, hashes []uint64, matched int) {
	if len(w.recency) == 0 || matched <= 0 || matched > len(hashes) || w.blockRefs.count(hashes[matched-1]) > 0 {
		return
	}
	st, ok := w.stampOf(hashes, matched)
	if !ok {
		return
	}
	s := w.free.segment(st.seg)
	if s == nil || st.off < s.popped {
		return
	}
	if r := s.blocks - st.off; r > s.removed {
		before := s.alive()
		s.removed = r
		w.free.alive -= int64(before - s.alive())
	}
}

// evictedLocked puts the head of w's shadow free queue past the stamped
// blocks among hashes, which the worker's events report evicted.
func (w *worker) evictedLocked(hashes []uint64) {
	for _, h := range hashes {
		st, ok := w.recency[h]
		if !ok {
			continue
		}
		delete(w.recency, h)
		s := w.free.segment(st.seg)
		if s == nil || st.off < s.popped || st.off >= s.blocks-s.removed {
			continue
		}
		q := &w.free
		q.alive -= q.untracked
		q.untracked = 0
		for q.base < st.seg {
			q.dropHead()
		}
		s = &q.segs[0]
		before := s.alive()
		s.popped = st.off + 1
		q.alive -= int64(before - s.alive())
	}
}

// stampLimit bounds w's stamps: twice what the queue's live blocks and
// segments can hold (one per stampStride blocks, two more per segment),
// so that a worker keeps a few tens of kilobytes of them, not whatever it
// ever served.
func (w *worker) stampLimit(capacity int) int {
	return 2*(capacity/stampStride+2*len(w.free.segs)) + 256
}

// pruneStamps drops the stamps whose blocks are out of the shadow queue
// (allocated, taken by a hit, or in a dropped segment) and, if that is not
// enough, others until at most keep are left.
func (w *worker) pruneStamps(keep int) {
	for h, st := range w.recency {
		if s := w.free.segment(st.seg); s == nil || st.off < s.popped || st.off >= s.blocks-s.removed {
			delete(w.recency, h)
		}
	}
	for h := range w.recency {
		if len(w.recency) <= keep {
			break
		}
		delete(w.recency, h)
	}
}

// blockSize is worker id's block size, 0 if unknown.
func (p *Pool) blockSize(id string) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if w := p.workers[id]; w != nil {
		return w.blockSize
	}
	return 0
}

// forecastLoss takes lost blocks off l's device overlap.
func (l *Load) forecastLoss(lost int) {
	l.MatchedBlocks -= lost
	l.ForecastLostBlocks = lost
}

// chargeAllocations adds a prefill's uncached blocks to the allocations
// queued on its worker.
func chargeAllocations(w *worker, prefillTokens int) {
	if prefillTokens <= 0 {
		return
	}
	w.allocDue = max(w.allocDue, w.stored) + uint64(blocksFor(prefillTokens, w.blockSize))
}

// releaseAllocations takes back the allocations of a prefill that will
// not run (freed or moved before its first token).
func releaseAllocations(w *worker, prefillTokens int) {
	if prefillTokens <= 0 || w.allocDue <= w.stored {
		return
	}
	w.allocDue -= min(uint64(blocksFor(prefillTokens, w.blockSize)), w.allocDue-w.stored)
}
