package scoring

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// fakeClock is a settable clock for Options.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testOptions returns the defaults with a fake clock and a seeded source.
func testOptions(clock *fakeClock, seed uint64) Options {
	o := DefaultOptions()
	o.Now = clock.Now
	o.Rand = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return o
}

// spec returns a worker spec for model "m" with block size 16.
func spec(id string) fleet.Worker {
	return fleet.Worker{ID: id, Model: "m", Address: "10.0.0.1:8000", BlockSize: 16,
		KVTotalBlocks: 1000, MaxNumBatchedTokens: 1024, MaxNumSeqs: 64}
}

// newTestScheduler returns a router with n workers w0..w{n-1} of spec().
func newTestScheduler(t testing.TB, o Options, n int) *Scheduler {
	t.Helper()
	r, err := NewScheduler(o)
	if err != nil {
		t.Fatalf("NewScheduler: %v", err)
	}
	for i := range n {
		if err := r.Pool().Upsert(spec(fmt.Sprintf("w%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// hashes returns n block hashes: the first shared from base, so requests
// built from the same base share a prefix.
func hashes(base uint64, shared, unique int, id int) []uint64 {
	out := make([]uint64, 0, shared+unique)
	for i := range shared {
		out = append(out, base<<32|uint64(i))
	}
	for i := range unique {
		out = append(out, uint64(id+1)<<40|uint64(i))
	}
	return out
}

func mustLoad(t testing.TB, p *Pool, id string) Load {
	t.Helper()
	l, ok := p.Load(id)
	if !ok {
		t.Fatalf("worker %s unknown", id)
	}
	return l
}

// costOf builds the cost model model with o's parameters, whatever cost
// model o names, for tests of one model's terms.
func costOf[T costModel](o Options, model string) T {
	o.CostModel = model
	return newCostModel(o.withDefaults()).(T)
}
