package scoring

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// active is one in-flight request. Guarded by Pool.mu.
type active struct {
	key    string // request ID, or "<router>\x00<id>" for a peer's request
	w      *worker
	hashes []uint64 // shared prompt blocks; immutable after Add
	// promptTokens and outputTokens size the request's blocks.
	promptTokens, outputTokens int
	// prefillTokens is the uncached prompt still to prefill; 0 once the
	// first token arrived. prefillAttn is its attention work over the
	// cached prefix and itself (attentionWork).
	prefillTokens int
	prefillAttn   float64
	// private is this request's share of worker.private.
	private  int
	lastSeen time.Time
	// addAt, fitX and fitZ feed the worker's rate fit when the first
	// token arrives: dispatch time, and the backlog plus own uncached
	// tokens then, and the same in attention work. fitX < 0 means "do not
	// learn" (peer or moved requests). fitW is the KV tokens the decode
	// steps beside that work read (decodeKVWork): its cost at
	// Options.DecodeKVCost is taken off the time before the fit learns
	// it, so the learned rate is the prefill's own. fitShared: other
	// requests were active on the worker at dispatch, so that work's
	// passes were shared (sharedPasses).
	addAt            time.Time
	fitX, fitZ, fitW float64
	fitShared        bool
	// pendingUntil is the deadline (Unix ns) of the pending records this
	// request made on its worker, 0 when it made none or its first token
	// arrived (the worker computed the prompt: nothing to take back).
	pendingUntil int64
	// awaiting: the request waits on its worker for its last prompt
	// block's BlockStored (first_token.go); awaitNext chains the requests
	// that wait for the same block. responded: its response started while
	// it waited.
	awaiting, responded bool
	awaitNext           *active
	// held is the leading prompt blocks counted as on the worker's device
	// at dispatch and not seen evicted since; the deepest of them is in
	// the worker's holding map while the request is in prefill.
	held int
	// matched is the overlap the request was sent for (forecast.go).
	matched int
}

func blocksFor(tokens, blockSize int) int {
	if tokens <= 0 {
		return 0
	}
	return (tokens + blockSize - 1) / blockSize
}

// privateBlocks is the request's blocks beyond its shared prompt blocks.
func (a *active) privateBlocks() int {
	n := blocksFor(a.promptTokens+a.outputTokens, a.w.spec.BlockSize) - len(a.hashes)
	return max(n, 0)
}

// Add records that req was routed to worker, whose overlap with the prompt
// was matchedBlocks. The request's uncached tokens count as prefill in
// flight until PrefillDone or Progress. Adding an ID that is active, or was
// freed recently, does nothing. Add copies req.Hashes.
//
// With the pending overlay on (Options.PendingTTL), the prompt's blocks
// after the first matchedBlocks become pending on the worker.
func (p *Pool) Add(req *Request, worker string, matchedBlocks int) error {
	return p.addLocal(req, worker, matchedBlocks, matchedBlocks)
}

// addLocal is Add for a decision whose overlap, matchedBlocks, counted
// indexed blocks as held: only the blocks after those become pending.
func (p *Pool) addLocal(req *Request, worker string, matchedBlocks, indexed int) error {
	ev, err := p.add(req.ID, worker, req.PromptTokens, matchedBlocks, -1, req.Hashes, indexed, true)
	if err != nil {
		return err
	}
	p.emit(ev)
	return nil
}

// add does Add for local and peer requests. prefill < 0 means "derive it
// from matchedBlocks". The hashes from position indexed on become pending.
func (p *Pool) add(key, worker string, promptTokens, matchedBlocks, prefill int, hashes []uint64, indexed int, local bool) (fleet.SyncEvent, error) {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.workers[worker]
	if !ok {
		return fleet.SyncEvent{}, fmt.Errorf("add request %q: worker %q: %w", key, worker, ErrUnknownWorker)
	}
	if _, dup := p.reqs[key]; dup || p.tomb.has(key) {
		return fleet.SyncEvent{}, nil
	}
	if prefill < 0 {
		prefill = max(promptTokens-matchedBlocks*w.spec.BlockSize, 0)
	}
	a := &active{key: key, w: w, hashes: slices.Clone(hashes), promptTokens: max(promptTokens, 0),
		prefillTokens: prefill, prefillAttn: attentionWork(prefill, promptTokens-prefill),
		lastSeen: now, addAt: now, fitX: -1, matched: matchedBlocks}
	p.settleBacklogLocked(w, now)
	if local {
		a.fitX, a.fitZ = w.backlog+float64(prefill), w.backlogAttn+a.prefillAttn
		a.fitW = decodeKVWork(a.fitX, p.kvUsedBlocksLocked(w, now)*w.spec.BlockSize, w.spec.MaxNumBatchedTokens)
		a.fitShared = w.requests > 0
	}
	p.hitLocked(w, a.hashes, min(matchedBlocks, indexed))
	p.chargeLocked(a)
	p.addChurnLocked(w, prefill, now)
	p.claimPendingLocked(a, indexed, now)
	p.reqs[key] = a
	defer p.summarizeLocked(w)
	if !local {
		return fleet.SyncEvent{}, nil
	}
	p.awaitLocked(a, indexed)
	p.holdLocked(a, min(matchedBlocks, indexed))
	return fleet.SyncEvent{Op: fleet.OpAdd, ID: key, Worker: worker, PromptTokens: a.promptTokens,
		PrefillTokens: a.prefillTokens, Hashes: a.hashes}, nil
}

// PrefillDone records the request's first token: its prompt is no longer
// prefill in flight. Unknown or finished IDs are ignored.
func (p *Pool) PrefillDone(id string) {
	if p.prefillDone(id) {
		p.opts.Metrics.FirstToken(FirstTokenResponse)
		p.emit(fleet.SyncEvent{Op: fleet.OpPrefillDone, ID: id})
		p.capacityChanged()
	}
}

func (p *Pool) prefillDone(key string) bool {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.reqs[key]
	if !ok {
		return false
	}
	a.lastSeen = now
	defer p.summarizeLocked(a.w)
	return p.clearPrefillLocked(a, now)
}

// clearPrefillLocked records a's first token: its prefill is done, and the
// time it took since dispatch teaches the worker's rate fit.
func (p *Pool) clearPrefillLocked(a *active, now time.Time) bool {
	p.unawaitLocked(a)
	p.unholdLocked(a)
	a.pendingUntil = 0
	if a.prefillTokens == 0 {
		return false
	}
	w := a.w
	p.settleBacklogLocked(w, now)
	if a.fitX >= 0 && !p.opts.NoLearnRates {
		y := now.Sub(a.addAt).Seconds()
		// The decode steps' share, as the prior prices it, is not the
		// prefill's; at most half the time is taken off, so a prior that
		// overprices it cannot leave the fit without samples.
		y -= min(p.opts.DecodeKVCost*a.fitW, y/2)
		others := 0
		if a.fitShared {
			others = 1
		}
		d := sharedPasses(a.fitX, others, w.spec.MaxNumBatchedTokens)
		w.fit.add(a.fitX, a.fitZ, d, y)
		p.fleetFit.add(a.fitX, a.fitZ, d, y)
	}
	w.prefillTokens -= a.prefillTokens
	w.prefillAttn = max(w.prefillAttn-a.prefillAttn, 0)
	w.prefillRequests--
	if w.prefillRequests == 0 {
		// Nothing queued allocates any more.
		w.allocDue = min(w.allocDue, w.stored)
	}
	a.prefillTokens, a.prefillAttn = 0, 0
	w.backlog = min(w.backlog, float64(w.prefillTokens))
	w.backlogAttn = min(w.backlogAttn, w.prefillAttn)
	return true
}

// Progress records the output tokens generated so far; decode blocks grow
// as blocks fill. It implies PrefillDone. Counts lower than an earlier one
// are ignored, as are unknown IDs.
func (p *Pool) Progress(id string, outputTokens int) {
	changed, prefill := p.progress(id, outputTokens)
	if changed {
		p.emit(fleet.SyncEvent{Op: fleet.OpProgress, ID: id, OutputTokens: outputTokens})
	}
	if prefill {
		p.opts.Metrics.FirstToken(FirstTokenResponse)
		p.capacityChanged()
	}
}

// progress reports whether the block count or prefill state changed (worth
// telling peers) and whether prefill finished.
func (p *Pool) progress(key string, outputTokens int) (changed, prefillDone bool) {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.reqs[key]
	if !ok {
		return false, false
	}
	a.lastSeen = now
	defer p.summarizeLocked(a.w)
	prefillDone = p.clearPrefillLocked(a, now)
	if outputTokens > a.outputTokens {
		a.outputTokens = outputTokens
		if n := a.privateBlocks(); n != a.private {
			a.w.private += n - a.private
			a.private = n
			changed = true
		}
	}
	return changed || prefillDone, prefillDone
}

// Free releases a request's load: at the end of the stream, on an error or
// on a cancel. Freeing an unknown or already freed ID does nothing.
func (p *Pool) Free(id string) {
	if p.free(id) {
		p.emit(fleet.SyncEvent{Op: fleet.OpFree, ID: id})
		p.capacityChanged()
	}
}

func (p *Pool) free(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tomb.add(key)
	a, ok := p.reqs[key]
	if !ok {
		return false
	}
	a.w.finished++
	p.freedLocked(a, p.opts.Now().UnixNano())
	p.releaseLocked(a)
	p.summarizeLocked(a.w)
	delete(p.reqs, key)
	return true
}

// releaseLocked takes a's load off its worker, and the pending blocks it
// claimed if its first token never came.
func (p *Pool) releaseLocked(a *active) {
	p.unawaitLocked(a)
	p.unholdLocked(a)
	w := a.w
	w.blockRefs.release(a.hashes)
	w.refs = w.blockRefs.len()
	if a.pendingUntil != 0 {
		// Blocks another active request on w holds stay pending for it.
		w.pending.forgetRecorded(a.hashes, a.pendingUntil, &w.blockRefs)
		a.pendingUntil = 0
	}
	w.private -= a.private
	w.requests--
	if a.prefillTokens > 0 {
		releaseAllocations(w, a.prefillTokens)
		w.prefillTokens -= a.prefillTokens
		w.prefillAttn = max(w.prefillAttn-a.prefillAttn, 0)
		w.prefillRequests--
		w.backlog = min(w.backlog, float64(w.prefillTokens))
		w.backlogAttn = min(w.backlogAttn, w.prefillAttn)
	}
}

// chargeLocked puts a's load on its worker a.w: block references, private
// blocks, the request and prefill counts. releaseLocked undoes it.
func (p *Pool) chargeLocked(a *active) {
	w := a.w
	w.blockRefs.add(a.hashes)
	w.refs = w.blockRefs.len()
	a.private = a.privateBlocks()
	w.private += a.private
	w.requests++
	w.adds++
	if a.prefillTokens > 0 {
		chargeAllocations(w, a.prefillTokens)
		w.prefillTokens += a.prefillTokens
		w.prefillRequests++
		w.prefillAttn += a.prefillAttn
		w.backlog += float64(a.prefillTokens) // settled to now by the caller
		w.backlogAttn += a.prefillAttn
	}
}

// Move transfers a request's load to another worker, for when the proxy
// reports it served the request elsewhere (a Gateway API fallback
// endpoint). Unknown request IDs are ignored; an unknown worker is an error.
func (p *Pool) Move(id, worker string) error {
	moved, err := p.move(id, worker)
	if err != nil {
		return err
	}
	if moved {
		p.emit(fleet.SyncEvent{Op: fleet.OpMove, ID: id, Worker: worker})
		p.capacityChanged()
	}
	return nil
}

func (p *Pool) move(key, worker string) (bool, error) {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.workers[worker]
	if !ok {
		return false, fmt.Errorf("move request %q: worker %q: %w", key, worker, ErrUnknownWorker)
	}
	a, ok := p.reqs[key]
	if !ok || a.w == w {
		return false, nil
	}
	p.releaseLocked(a)
	p.summarizeLocked(a.w)
	defer p.summarizeLocked(w)
	a.w, a.lastSeen, a.fitX = w, now, -1
	p.settleBacklogLocked(w, now)
	p.chargeLocked(a)
	if a.prefillTokens > 0 {
		p.claimPendingLocked(a, 0, now)
		if !strings.Contains(a.key, "\x00") {
			p.awaitLocked(a, 0)
		}
	}
	return true, nil
}

// Active reports whether a request is in flight.
func (p *Pool) Active(id string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	_, ok := p.reqs[id]
	return ok
}

// Sweep force-frees requests with no lifecycle call for longer than
// Options.MaxRequestAge, so nothing leaks when a stream vanishes, drops
// expired pending blocks, and returns how many requests it freed. Scheduler.Run calls it periodically.
func (p *Pool) Sweep() int {
	now := p.opts.Now()
	cutoff := now.Add(-p.opts.MaxRequestAge)
	var local []string
	p.mu.Lock()
	p.expirePendingLocked(now)
	n := 0
	for key, a := range p.reqs {
		if a.lastSeen.Before(cutoff) {
			p.releaseLocked(a)
			p.summarizeLocked(a.w)
			delete(p.reqs, key)
			p.tomb.add(key)
			n++
			if !strings.Contains(key, "\x00") {
				local = append(local, key)
			}
		}
	}
	p.mu.Unlock()
	// Peers learn of our force-frees at once instead of sweeping later.
	for _, key := range local {
		p.emit(fleet.SyncEvent{Op: fleet.OpFree, ID: key})
	}
	if n > 0 {
		p.opts.Metrics.Expired(n)
	}
	if owed := p.kickOwed.Swap(false); n > 0 || owed {
		p.capacityChanged()
	}
	return n
}

// tombstones remembers recently freed IDs so a late Add (or a peer's
// reordered event) cannot resurrect a finished request. Bounded: the
// oldest names are forgotten first.
type tombstones struct {
	set  map[string]struct{}
	ring []string
	next int
}

func newTombstones(n int) tombstones {
	return tombstones{set: make(map[string]struct{}, n), ring: make([]string, n)}
}

func (t *tombstones) has(key string) bool {
	_, ok := t.set[key]
	return ok
}

func (t *tombstones) add(key string) {
	if t.has(key) {
		return
	}
	if old := t.ring[t.next]; old != "" {
		delete(t.set, old)
	}
	t.ring[t.next] = key
	t.set[key] = struct{}{}
	t.next = (t.next + 1) % len(t.ring)
}
