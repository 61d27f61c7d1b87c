package kvindex

import (
	"sync/atomic"
	"unsafe"
)

// candidateCache remembers how the last candidate list resolved to worker
// slots, so that a router asking about the same pool request after request
// looks names up once per pool change instead of once per request.
//
// Entries are immutable once published and replaced whole, so concurrent
// Matches under a read lock may read and replace it; gen is the owner's
// worker generation, which changes (under its write lock) whenever a worker
// is added or removed, and invalidates every entry made before.
type candidateCache struct {
	last atomic.Pointer[resolvedCandidates]
}

type resolvedCandidates struct {
	gen   uint64
	names []string
	slots []int32  // -1 for an unknown name
	mask  []uint64 // the slots of the known names as a bitset
}

// get returns the resolution of names if the cached list is names at gen.
func (c *candidateCache) get(gen uint64, names []string) (*resolvedCandidates, bool) {
	r := c.last.Load()
	if r == nil || r.gen != gen || len(r.names) != len(names) {
		return nil, false
	}
	// Equal strings usually share their bytes (the pool's worker ids), so
	// the two lists' string headers are usually equal byte for byte: one
	// wide comparison instead of a call per name.
	if len(names) > 0 && headerBytes(r.names) == headerBytes(names) {
		return r, true
	}
	for i, n := range names {
		if r.names[i] != n {
			return nil, false
		}
	}
	return r, true
}

// headerBytes is the memory of names' string headers, as a string.
func headerBytes(names []string) string {
	return unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(names))), len(names)*int(unsafe.Sizeof("")))
}

// resolve returns the resolution of names at gen, when the owner has
// nslots worker slots, looking them up with lookup and caching the result
// when the cache does not hold them. Only a miss allocates. The result is
// shared: callers must not modify it.
func (c *candidateCache) resolve(gen uint64, nslots int, names []string, lookup func(string) int32) *resolvedCandidates {
	if r, ok := c.get(gen, names); ok {
		return r
	}
	r := &resolvedCandidates{
		gen: gen, names: append([]string(nil), names...),
		slots: make([]int32, len(names)), mask: make([]uint64, (nslots+63)/64),
	}
	for i, n := range names {
		s := lookup(n)
		r.slots[i] = s
		if s >= 0 {
			r.mask[s>>6] |= 1 << (s & 63)
		}
	}
	c.last.Store(r)
	return r
}
