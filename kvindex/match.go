package kvindex

import "sync"

// MatchResult is one worker's answer to a Match: how many leading blocks of
// the prompt it holds on the device tier, and how many it holds in all.
// The worker is the candidate at the same position. A result is 20 bytes
// with no pointer: over a large fleet, writing the results is most of a
// lookup.
type MatchResult struct {
	// Blocks is the number of consecutive leading prompt blocks held.
	Blocks int32
	// Cached is the worker's total device blocks, for tie-breaks.
	Cached int32
	// HostBlocks and DiskBlocks count the blocks right after the device
	// prefix that the worker holds in host memory, then on other media
	// (disk): offloaded KV that loads faster than it computes. The
	// approximate index leaves them 0.
	HostBlocks, DiskBlocks int32
	// Known is false when the index has no such worker; Blocks and Cached
	// are then 0.
	Known bool
	// Stale is true while the worker's view may be out of date (a sequence
	// gap or restart, or an unknown parent) and it has not resynced.
	Stale bool
}

// reset overwrites r with a fresh result, field by field. Assigning a
// composite literal through the slice instead builds it on the stack with
// narrow stores and copies it with wide loads, which stall on store
// forwarding: for 64 candidates that was most of Match's fixed cost.
func (r *MatchResult) reset(known, stale bool, cached, blocks int) {
	r.Blocks = int32(blocks)
	r.Cached = int32(cached)
	r.HostBlocks = 0
	r.DiskBlocks = 0
	r.Known = known
	r.Stale = stale
}

// Matcher is what the scorer needs from an index: Index (events) and
// Approx (the router's own decisions) both provide it.
type Matcher interface {
	// Match writes into out (resized to len(candidates), reusing its
	// storage) one result per candidate, aligned with candidates, and
	// returns it.
	Match(hashes []uint64, candidates []string, out []MatchResult) []MatchResult
}

var (
	_ Matcher = (*Index)(nil)
	_ Matcher = (*Approx)(nil)
)

// matchSlots is Approx's walk: it returns, indexed by worker slot (below
// nslots), the number of leading hashes each worker in walked holds in t.
// Only the depths of those workers are set. The caller holds the read lock
// that guards t.
func matchSlots(t *holderTable, nslots int, hashes []uint64, walked []uint64, bufs *matchBufs) []int32 {
	depth := bufs.depth(nslots)
	clear(depth)
	alive := aliveOf(walked)
	alive.zeroed = true
	walk(t, hashes, &alive, 0, depth)
	return depth
}

// matchChains is Index's walk: matchSlots over a chainTable. With track
// it also returns the slots whose depth is not 0 (from bufs).
func matchChains(t *chainTable, nslots int, hashes []uint64, walked []uint64, bufs *matchBufs, track bool) (depth, touched []int32) {
	depth = bufs.depth(nslots)
	clear(depth)
	alive := aliveOf(walked)
	alive.zeroed = true
	if track {
		alive.touched = bufs.touchedRoom(nslots)
	}
	walkChains(t, hashes, &alive, 0, depth)
	return depth, alive.touched
}

// matchBufs is a Match's working memory: on the stack for a fleet of up to
// 64 workers (256 in the mask), from a pool beyond, so that Match does not
// allocate however large the fleet. release returns the pooled part.
type matchBufs struct {
	depth1 [64]int32
	mask1  [4]uint64
	large  *largeBufs
}

type largeBufs struct {
	depth   []int32
	walked  []uint64
	touched []int32
}

var largePool = sync.Pool{New: func() any { return new(largeBufs) }}

func (b *matchBufs) pooled() *largeBufs {
	if b.large == nil {
		b.large = largePool.Get().(*largeBufs)
	}
	return b.large
}

// depth returns room for n depths.
func (b *matchBufs) depth(n int) []int32 {
	if n <= len(b.depth1) {
		return b.depth1[:n]
	}
	l := b.pooled()
	l.depth = resize(l.depth, n)
	return l.depth
}

// touchedRoom returns an empty list with room for n slots.
func (b *matchBufs) touchedRoom(n int) []int32 {
	l := b.pooled()
	l.touched = resize(l.touched, n)
	return l.touched[:0]
}

// mask returns a zeroed mask over slots slots.
func (b *matchBufs) mask(slots int) []uint64 {
	n := (slots + 63) / 64
	if n <= len(b.mask1) {
		return b.mask1[:n]
	}
	l := b.pooled()
	l.walked = resize(l.walked, n)
	clear(l.walked)
	return l.walked
}

func (b *matchBufs) release() {
	if b.large != nil {
		largePool.Put(b.large)
		b.large = nil
	}
}
