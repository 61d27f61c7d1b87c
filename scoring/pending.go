package scoring

import "time"

// The pending overlay: what the router has just sent where. The KV index
// learns of a prompt block only once an engine has stored it and its
// BlockStored event has arrived; until then every decision is blind to the
// requests routed a moment before, and a burst of sessions sharing a
// system prompt scatters over the fleet. So each worker also keeps the
// prompt blocks routed to it that its events have not confirmed yet, and
// a pick counts them as overlap after the indexed prefix (see
// docs/architecture.md §3.7).
//
// An entry ends when the worker's events report the block stored
// (Pool.BlocksStored: the index holds it from then on), when the request
// that made it is freed before its first token (the worker never computed
// it), after Options.PendingTTL, and with all of the worker's entries when
// the worker is removed or ejected or its view in the index is reset or
// marked stale (Pool.CacheReset).

// Defaults of the pending overlay.
const (
	// DefaultPendingTTL: long enough to cover a burst's queueing and
	// prefill before the worker's events confirm the blocks, short enough
	// that a worker without prefix caching is not believed for long.
	// Chosen with kvbench sim (the burst workload; docs/routing.md).
	DefaultPendingTTL = 2 * time.Second
	// DefaultPendingMaxBlocks bounds one worker's pending records.
	DefaultPendingMaxBlocks = 1 << 14
)

// pendingBlocks is one worker's pending overlay. Guarded by Pool.mu: picks
// read it under the read lock, Adds and events write it under the write
// lock. The zero value is empty and ready.
type pendingBlocks struct {
	// live is len(until), kept with it: a pick reads it for every
	// candidate, and the map's header is a cache line of its own.
	live int
	// bits has two bits set for every hash in until (see mayHold), and
	// for some that left it since: cleared when until empties.
	bits [4]uint64
	// until maps a block hash to its newest record's deadline and place
	// (hashtable.go), but for hash 0, whose entry is zeroEntry when
	// hasZero.
	until     hashTable[pendingEntry]
	zeroEntry pendingEntry
	hasZero   bool
	// fifo holds the records in the order they were made, live from head.
	// A record whose deadline is no longer until's was superseded (or its
	// entry removed) and only waits to be popped.
	fifo []pendingRecord
	head int
}

type pendingRecord struct {
	hash  uint64
	until int64
}

// pendingEntry is a block's newest record: its deadline (Unix ns, the
// pool's clock) and how many blocks were recorded after it in the same
// call, which lets run jump to the end of a prompt's record.
type pendingEntry struct {
	until int64
	after int32
}

// get returns h's entry, if it has one.
func (pb *pendingBlocks) get(h uint64) (pendingEntry, bool) {
	if h == 0 {
		return pb.zeroEntry, pb.hasZero
	}
	if i := pb.until.find(h); i >= 0 {
		return pb.until.slots[i].v, true
	}
	return pendingEntry{}, false
}

// set makes e h's entry; for a new hash other than 0, until.reserve must
// have made room.
func (pb *pendingBlocks) set(h uint64, e pendingEntry) {
	if h == 0 {
		pb.zeroEntry, pb.hasZero = e, true
		return
	}
	pb.until.slots[pb.until.upsert(h)].v = e
}

// remove drops h's entry, if it has one.
func (pb *pendingBlocks) remove(h uint64) {
	if h == 0 {
		pb.zeroEntry, pb.hasZero = pendingEntry{}, false
		return
	}
	if i := pb.until.find(h); i >= 0 {
		pb.until.deleteAt(i)
	}
}

// entries is the number of entries; live keeps it between calls.
func (pb *pendingBlocks) entries() int {
	if pb.hasZero {
		return pb.until.used + 1
	}
	return pb.until.used
}

// record notes hashes as pending until deadline, renewing existing
// entries. At most max records are kept: a prompt longer than that is
// recorded up to max blocks (a prefix is what counts), and past it the
// oldest records go first, so what survives of an older prompt is what a
// newer prompt sharing its prefix renewed.
func (pb *pendingBlocks) record(hashes []uint64, now, deadline int64, max int) {
	hashes = hashes[:min(len(hashes), max)]
	if len(hashes) == 0 {
		return
	}
	pb.expire(now)
	pb.until.reserve(len(hashes))
	for i, h := range hashes {
		pb.set(h, pendingEntry{until: deadline, after: int32(len(hashes) - 1 - i)})
		pb.fifo = append(pb.fifo, pendingRecord{hash: h, until: deadline})
		i0, b0, i1, b1 := filterBits(h)
		pb.bits[i0] |= b0
		pb.bits[i1] |= b1
	}
	for len(pb.fifo)-pb.head > max {
		pb.pop()
	}
	pb.compact()
	pb.counted()
}

// counted sets live after entries were added or removed.
func (pb *pendingBlocks) counted() {
	pb.live = pb.entries()
	if pb.live == 0 {
		pb.bits = [4]uint64{}
	}
}

// filterBits are h's two bits in pendingBlocks.bits, one in each half
// (words i0 and i1), from h's top bits once mixed: block hashes need not
// be random.
func filterBits(h uint64) (i0 int, b0 uint64, i1 int, b1 uint64) {
	m := h * 0x9e3779b97f4a7c15
	x, y := m>>57, m>>50&127
	return int(x >> 6), 1 << (x & 63), 2 + int(y>>6), 1 << (y & 63)
}

// mayHold reports whether bits (pendingBlocks.bits) may have h: false
// means h is not pending.
func mayHold(bits *[4]uint64, h uint64) bool {
	i0, b0, i1, b1 := filterBits(h)
	return bits[i0]&b0 != 0 && bits[i1]&b1 != 0
}

// pop drops the oldest record, and its entry unless a newer record renewed it.
func (pb *pendingBlocks) pop() {
	r := pb.fifo[pb.head]
	if e, ok := pb.get(r.hash); ok && e.until == r.until {
		pb.remove(r.hash)
	}
	pb.fifo[pb.head] = pendingRecord{}
	pb.head++
	pb.counted()
}

// expire drops the records whose deadline has passed. Deadlines grow along
// the fifo, so it stops at the first live one.
func (pb *pendingBlocks) expire(now int64) {
	for pb.head < len(pb.fifo) && pb.fifo[pb.head].until <= now {
		pb.pop()
	}
	pb.compact()
}

// compact reuses the fifo's storage once half of it is popped.
func (pb *pendingBlocks) compact() {
	if pb.head == len(pb.fifo) {
		pb.fifo, pb.head = pb.fifo[:0], 0
		return
	}
	if pb.head >= 64 && pb.head >= len(pb.fifo)/2 {
		n := copy(pb.fifo, pb.fifo[pb.head:])
		clear(pb.fifo[n:])
		pb.fifo, pb.head = pb.fifo[:n], 0
	}
}

// run counts the blocks of hashes from position from on that are pending
// at now, up to the first that is not.
//
// Hashes are chained, so a prompt block recorded at some place of a
// record stands for the whole prefix up to it. run therefore jumps from a
// pending block to the last block of the same record the prompt reaches,
// and when that block is there with the same deadline, counts everything
// between without looking: records are popped oldest first and a freed
// request's blocks are dropped only where no active request holds them
// (which would hold the prefix too), so nothing between can be gone
// unless the worker's events reported it stored, and then the index
// holds it. A failed jump falls back to block by block.
func (pb *pendingBlocks) run(hashes []uint64, from int, now int64) int {
	if pb.live == 0 || from >= len(hashes) {
		return 0
	}
	k, jump := max(from, 0), true
	for k < len(hashes) {
		e, ok := pb.get(hashes[k])
		if !ok || e.until <= now {
			break
		}
		if j := min(k+int(e.after), len(hashes)-1); jump && j > k {
			if e2, ok := pb.get(hashes[j]); ok && e2.until == e.until {
				k = j + 1
				continue
			}
			jump = false
		}
		k++
	}
	return k - max(from, 0)
}

// forget removes the entries of hashes, e.g. because the worker's events
// reported them stored.
func (pb *pendingBlocks) forget(hashes []uint64) {
	if pb.live == 0 {
		return
	}
	for _, h := range hashes {
		// Most stored blocks were never pending: the filter says so
		// without a lookup.
		if mayHold(&pb.bits, h) {
			pb.remove(h)
		}
	}
	pb.counted()
}

// forgetRecorded removes the entries of hashes whose newest record is the
// one made at deadline, unless held counts an active request holding the
// block: what a request freed before its first token had claimed.
func (pb *pendingBlocks) forgetRecorded(hashes []uint64, deadline int64, held *blockRefs) {
	if pb.live == 0 {
		return
	}
	for _, h := range hashes {
		if e, ok := pb.get(h); ok && e.until == deadline && held.count(h) == 0 {
			pb.remove(h)
		}
	}
	pb.counted()
}

// reset drops every entry.
func (pb *pendingBlocks) reset() {
	pb.until.reset()
	pb.zeroEntry, pb.hasZero = pendingEntry{}, false
	clear(pb.fifo)
	pb.fifo, pb.head, pb.live, pb.bits = pb.fifo[:0], 0, 0, [4]uint64{}
}

// len is the number of pending entries, expired ones included until the
// next write.
func (pb *pendingBlocks) len() int { return pb.live }

// addPending extends l's device overlap by n pending blocks. They lie
// where the index saw host and disk blocks, if any, which then count as
// device blocks.
func (l *Load) addPending(n int) {
	if n <= 0 {
		return
	}
	l.PendingBlocks = n
	l.MatchedBlocks += n
	onHost := min(n, l.HostBlocks)
	l.HostBlocks -= onHost
	l.DiskBlocks = max(l.DiskBlocks-(n-onHost), 0)
}

// claimPendingLocked records a's blocks from position from on as pending
// on its worker, when the overlay is on.
func (p *Pool) claimPendingLocked(a *active, from int, now time.Time) {
	ttl := p.opts.PendingTTL
	if ttl <= 0 || from >= len(a.hashes) {
		return
	}
	ns := now.UnixNano()
	a.pendingUntil = ns + int64(ttl)
	a.w.pending.record(a.hashes[max(from, 0):], ns, a.pendingUntil, p.opts.PendingMaxBlocks)
}

// BlocksStored reconciles the pending overlay with a worker's KV events:
// the worker stored these blocks, so the index holds them from now on and
// their pending entries are dropped. kvindex.Index calls it (see
// kvindex.Observer). Unknown workers are ignored.
//
// It also ends the prefill of the requests that wait for one of these
// blocks as their first token (first_token.go).
func (p *Pool) BlocksStored(worker string, hashes []uint64) {
	var buf [4]string
	done := buf[:0]
	p.mu.Lock()
	if w := p.workers[worker]; w != nil {
		live := w.pending.live
		w.pending.forget(hashes)
		w.storesBlocks = true
		w.stored += uint64(len(hashes))
		w.free.pop(int64(len(hashes)))
		if len(w.awaiting) > 0 {
			done = p.storedLocked(w, hashes, done)
		}
		// The summary holds the overlay's size and filter (which changes
		// only when the overlay empties) and the prefill a stored block
		// may have ended (storedLocked ends it for every waiter it finds,
		// so a waiter found means a change); when neither moved, it is
		// current.
		if w.pending.live != live || len(done) > 0 {
			p.summarizeLocked(w)
		}
	}
	p.mu.Unlock()
	p.firstTokens(done, FirstTokenKVEvent)
}

// CacheReset drops a worker's pending blocks: its cache was cleared, or
// the index's view of it was purged or went stale, so nothing believed
// about it still holds. Unknown workers are ignored.
//
// The requests on the worker that wait for a block as their first token
// stop waiting (first_token.go).
func (p *Pool) CacheReset(worker string) {
	var buf [4]string
	done := buf[:0]
	p.mu.Lock()
	if w := p.workers[worker]; w != nil {
		w.pending.reset()
		clear(w.recency)
		w.free.reset(p.capacityLocked(w, p.opts.Now().UnixNano()))
		done = p.resetAwaitingLocked(w, done)
		p.summarizeLocked(w)
	}
	p.mu.Unlock()
	p.firstTokens(done, FirstTokenEventGap)
}

// PendingBlocks returns the number of blocks pending on a worker (expired
// entries included until the next write or Sweep), for debugging and tests.
func (p *Pool) PendingBlocks(worker string) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if w := p.workers[worker]; w != nil {
		return w.pending.len()
	}
	return 0
}

// expirePendingLocked drops every worker's expired pending records.
func (p *Pool) expirePendingLocked(now time.Time) {
	ns := now.UnixNano()
	for _, w := range p.workers {
		live, bits := w.pending.live, w.pending.bits
		w.pending.expire(ns)
		if w.pending.live != live || w.pending.bits != bits {
			p.summarizeLocked(w)
		}
	}
}
