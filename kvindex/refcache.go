package kvindex

import "sync/atomic"

// candidateCache remembers how the last candidate list resolved to worker
// states, so that a router asking about the same pool request after request
// looks names up once per pool change instead of once per request. W is the
// index's worker state type.
//
// Entries are immutable once published and replaced whole, so concurrent
// Matches under a read lock may read and replace it; gen is the owner's
// worker generation, which changes (under its write lock) whenever a worker
// is added or removed, and invalidates every entry made before.
type candidateCache[W any] struct {
	last atomic.Pointer[resolvedCandidates[W]]
}

type resolvedCandidates[W any] struct {
	gen   uint64
	names []string
	ws    []*W // nil for an unknown name
}

// get returns the states of names if the cached list is names at gen.
func (c *candidateCache[W]) get(gen uint64, names []string) ([]*W, bool) {
	r := c.last.Load()
	if r == nil || r.gen != gen || len(r.names) != len(names) {
		return nil, false
	}
	for i, n := range names {
		// Equal strings usually share their bytes (the pool's worker ids),
		// which makes this compare a pointer check.
		if r.names[i] != n {
			return nil, false
		}
	}
	return r.ws, true
}

// resolve returns the states of names at gen, looking them up with lookup
// and caching the result when the cache does not hold them. Only a miss
// allocates.
func (c *candidateCache[W]) resolve(gen uint64, names []string, lookup func(string) *W) []*W {
	if ws, ok := c.get(gen, names); ok {
		return ws
	}
	r := &resolvedCandidates[W]{gen: gen, names: append([]string(nil), names...), ws: make([]*W, len(names))}
	for i, n := range names {
		r.ws[i] = lookup(n)
	}
	c.last.Store(r)
	return r.ws
}
