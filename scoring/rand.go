package scoring

import (
	"math/rand/v2"
	"sync"
)

// Rand is the random source for tie-breaking and sampling. A
// *math/rand/v2.Rand satisfies it; tests pass a seeded one so decisions are
// reproducible. The package serialises calls, so the source need not be
// safe for concurrent use.
type Rand interface {
	// Float64 returns a number in [0, 1).
	Float64() float64
	// IntN returns a number in [0, n); n > 0.
	IntN(n int) int
}

// lockedRand serialises a Rand shared by concurrent picks.
type lockedRand struct {
	mu sync.Mutex
	r  Rand
}

var _ Rand = (*lockedRand)(nil)

func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	v := l.r.Float64()
	l.mu.Unlock()
	return v
}

func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	v := l.r.IntN(n)
	l.mu.Unlock()
	return v
}

// runtimeRand draws from math/rand/v2's top-level functions, which are
// safe for concurrent use without a lock (each thread has its own
// generator): the default when no Rand is given, since production needs no
// reproducible sequence and concurrent picks then share no mutex.
type runtimeRand struct{}

var _ Rand = runtimeRand{}

func (runtimeRand) Float64() float64 { return rand.Float64() }
func (runtimeRand) IntN(n int) int   { return rand.IntN(n) }
