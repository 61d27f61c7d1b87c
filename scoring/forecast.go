package scoring

// The eviction forecast. A prompt's cached prefix on a worker is a hit
// only if it is still there when the request runs, and a request that
// waits behind other prefills runs after they have allocated their blocks.
// Engines allocate from a free queue in least-recently-used order (vLLM's
// free block queue; a freed request's blocks join its tail, deepest
// first), so a prefix no running request uses is evicted once the
// allocations since it was freed exceed the blocks that were ahead of it
// in that queue. A decision that counted such a prefix as cached sends a
// request to a worker that will compute it again, behind a queue it was
// not charged for.
//
// The pool forecasts that loss at pick time from what it already sees:
//
//   - stored, per worker, counts the device blocks its KV events reported
//     stored: the engine's allocations, as far as its events tell;
//   - allocDue is the value stored will reach once the prefills sent to
//     the worker have allocated their uncached blocks, so allocDue −
//     stored is the allocations queued ahead of a new request;
//   - when a request ends, recency stamps its deepest prompt block, the
//     deepest block of the hit it was sent for and every 16th block with
//     their place in the free queue then (the worker's free blocks, plus
//     the request's blocks freed before them) and the stored count.
//
// The queue also moves where a hit takes a free block out of its middle,
// which the stored count does not see; so each worker learns how far its
// queue moves per stored block from the stamped blocks its events report
// evicted (the stamp's place over the blocks stored until then).
//
// A candidate whose matched prefix ends on a block that no active request
// holds has that block at its stamp's place (or the place of the stamp
// above it, less the blocks between) less the blocks stored since, times
// that speed; the allocations queued ahead evict it, and the blocks
// before it, deepest first, as far as they reach past it. The candidate's
// overlap shrinks by that many blocks, so its uncached tokens, its
// predicted time and the duplicate-prefill term (which compares holders'
// prefixes) all see the loss. A stamp whose block should already be gone,
// yet the index still holds, is wrong about the queue (hits and frees in
// the middle reorder it) and forecasts nothing. The forecast reads only
// the worker's own state under the pool's lock, so the full and the
// pruned decision make the same one.

// recencyStamp is where a prompt block stood in its worker's free queue
// when the last request counted as using it ended.
type recencyStamp struct {
	// pos is the number of blocks ahead of it in the free queue then.
	pos int64
	// at is the worker's stored count then.
	at uint64
}

// maxRecencyStamps bounds one worker's stamps; past it, the stamps whose
// blocks are gone by their own count are dropped, then any.
const maxRecencyStamps = 1 << 14

// queuedAllocations is the blocks the prefills sent to w will still
// allocate, as far as its events have not reported them stored.
func (w *worker) queuedAllocations() int64 {
	if w.allocDue > w.stored {
		return int64(w.allocDue - w.stored)
	}
	return 0
}

// stampStride: besides a request's deepest prompt block and the deepest
// block of its hit, every stampStride-th prompt block is stamped, so that
// a later prompt that parts from this one between two of those still
// finds a stamp at most stampStride−1 blocks above its matched prefix's
// end.
const stampStride = 16

// forecastLossLocked is how many of the prompt's first matched blocks on w
// the allocations queued ahead of it would evict before it runs.
func (p *Pool) forecastLossLocked(w *worker, hashes []uint64, matched int) int {
	if len(w.recency) == 0 || matched <= 0 || matched > len(hashes) {
		return 0
	}
	n := w.queuedAllocations()
	if n <= 0 {
		return 0
	}
	last := hashes[matched-1]
	if w.blockRefs.count(last) > 0 {
		// In use by an active request: not in the free queue.
		return 0
	}
	st, ok := w.recency[last]
	if !ok {
		// The stamp above it: the request that freed it freed the
		// blocks after it, down to this one, just before it.
		j := matched/stampStride*stampStride - 1
		if j < 0 {
			return 0
		}
		if st, ok = w.recency[hashes[j]]; !ok {
			return 0
		}
		st.pos -= int64(matched - 1 - j)
	}
	pos := st.pos - int64(w.speed()*float64(w.stored-st.at))
	if pos < 0 || n <= pos {
		return 0
	}
	return int(min(n-pos, int64(matched)))
}

// stampLocked records, as a ends, where its prompt blocks join w's free
// queue: its deepest, the deepest of the hit it was sent for, and every
// stampStride-th. now is the pool's clock; a's blocks still count as in
// use.
func (p *Pool) stampLocked(a *active, now int64) {
	w := a.w
	if p.opts.NoEvictionForecast || len(a.hashes) == 0 {
		return
	}
	capacity := w.kvTotalBlocks
	fresh := w.hasReport && now-w.reportAt.UnixNano() <= int64(p.opts.StaleReportAge)
	used := w.activeBlocks()
	if fresh {
		if w.report.KVTotalBlocks > 0 {
			capacity = w.report.KVTotalBlocks
		}
		used = max(used, w.report.KVUsedBlocks)
	}
	if capacity <= 0 {
		return
	}
	if w.recency == nil {
		w.recency = make(map[uint64]recencyStamp)
	} else if len(w.recency)+len(a.hashes)/stampStride+2 > maxRecencyStamps {
		w.pruneStamps()
	}
	free := max(capacity-used, 0)
	// The request's blocks join the queue deepest first: block j has
	// the free blocks and its blocks after j ahead of it.
	total := max(blocksFor(a.promptTokens+a.outputTokens, w.blockSize), len(a.hashes))
	stamp := func(j int) {
		w.recency[a.hashes[j]] = recencyStamp{pos: int64(free + total - 1 - j), at: w.stored}
	}
	for j := stampStride - 1; j < len(a.hashes)-1; j += stampStride {
		stamp(j)
	}
	stamp(len(a.hashes) - 1)
	if m := a.matched; m > 0 && m < len(a.hashes) {
		stamp(m - 1)
	}
}

// speed is queueSpeed, 1 until an eviction taught it.
func (w *worker) speed() float64 {
	if w.queueSpeed > 0 {
		return w.queueSpeed
	}
	return 1
}

// Bounds and weight of a queueSpeed sample.
const (
	minQueueSpeed, maxQueueSpeed = 0.5, 4.0
	queueSpeedWeight             = 0.1
)

// learnQueueSpeed takes, from the stamped blocks the worker's events just
// removed, how far the free queue really moved per stored block: a block
// evicted had its stamp's place ahead of it consumed by the blocks stored
// since and by the hits and frees in the middle of the queue, which the
// stored count does not see. Their stamps go.
func (w *worker) learnQueueSpeed(hashes []uint64) {
	for _, h := range hashes {
		st, ok := w.recency[h]
		if !ok {
			continue
		}
		delete(w.recency, h)
		d := w.stored - st.at
		if d == 0 || st.pos <= 0 {
			continue
		}
		x := min(max(float64(st.pos)/float64(d), minQueueSpeed), maxQueueSpeed)
		if w.queueSpeed == 0 {
			w.queueSpeed = x
		} else {
			w.queueSpeed += queueSpeedWeight * (x - w.queueSpeed)
		}
	}
}

// pruneStamps drops the stamps whose blocks are gone by their own count,
// and, if that is not enough, enough others to halve the map.
func (w *worker) pruneStamps() {
	for h, st := range w.recency {
		if float64(st.pos) < w.speed()*float64(w.stored-st.at) {
			delete(w.recency, h)
		}
	}
	for h := range w.recency {
		if len(w.recency) <= maxRecencyStamps/2 {
			break
		}
		delete(w.recency, h)
	}
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
