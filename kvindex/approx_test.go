package kvindex

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for Approx.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestApproxMatchesRecordedPrefixesUntilTheTTL(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	a := NewApprox(ApproxConfig{Now: clock.Now})
	p := promptHashes(1, 8)
	a.Record("w0", p[:5])
	clock.Advance(60 * time.Second)
	a.Record("w1", p[:3])

	res := a.Match(p, []string{"w0", "w1", "w2"}, nil)
	if res[0].Blocks != 5 || res[1].Blocks != 3 || res[2].Blocks != 0 || res[2].Known {
		t.Fatalf("results = %+v", res)
	}
	if res[0].Cached != 5 {
		t.Fatalf("w0 caches %d, want 5", res[0].Cached)
	}
	clock.Advance(60*time.Second - time.Nanosecond)
	if got := a.Match(p, []string{"w0"}, nil)[0].Blocks; got != 5 {
		t.Fatalf("just before the TTL w0 matches %d, want 5", got)
	}
	clock.Advance(time.Nanosecond) // w0's record is 120 s old
	res = a.Match(p, []string{"w0", "w1"}, nil)
	if res[0].Blocks != 0 || res[1].Blocks != 3 {
		t.Fatalf("after w0's TTL: %+v", res)
	}
	if a.Len() != 3 {
		t.Fatalf("Len = %d, want 3", a.Len())
	}
}

func TestApproxReRecordingRefreshesBlocks(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	a := NewApprox(ApproxConfig{Now: clock.Now, TTL: 10 * time.Second})
	p := promptHashes(1, 4)
	a.Record("w0", p)
	clock.Advance(8 * time.Second)
	a.Record("w0", p[:2]) // the shared prefix was used again
	clock.Advance(4 * time.Second)
	if got := a.Match(p, []string{"w0"}, nil)[0]; got.Blocks != 2 || got.Cached != 2 {
		t.Fatalf("after the first record expired: %+v, want the refreshed 2 blocks", got)
	}
}

func TestApproxPrunesOldestAndDeepestFirst(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	a := NewApprox(ApproxConfig{Now: clock.Now, MaxBlocks: 10, PruneTo: 0.8})
	p1, p2, p3 := promptHashes(1, 4), promptHashes(2, 4), promptHashes(3, 4)
	a.Record("w0", p1)
	clock.Advance(time.Second)
	a.Record("w1", p2)
	clock.Advance(time.Second)
	a.Record("w0", p3) // 12 > 10: prune to 8, all from p1's record
	if a.Len() != 8 {
		t.Fatalf("Len after prune = %d, want 8", a.Len())
	}
	res := a.Match(p1, []string{"w0"}, nil)
	if res[0].Blocks != 0 {
		t.Fatalf("oldest record survived: %+v", res)
	}
	a.Record("w1", promptHashes(4, 3)) // 11 > 10: prune 3 from p2's record, deepest first
	if got := a.Match(p2, []string{"w1"}, nil)[0].Blocks; got != 1 {
		t.Fatalf("p2 keeps %d leading blocks, want 1 (deepest pruned first)", got)
	}
	if got := a.Match(p3, []string{"w0"}, nil)[0].Blocks; got != 4 {
		t.Fatalf("newer record lost blocks: %d", got)
	}
}

func TestApproxRemoveWorker(t *testing.T) {
	a := NewApprox(ApproxConfig{})
	p := promptHashes(1, 4)
	a.Record("w0", p)
	a.Record("w1", p[:2])
	a.RemoveWorker("w0")
	res := a.Match(p, []string{"w0", "w1"}, nil)
	if len(res) != 2 || res[0].Known || res[0].Blocks != 0 || !res[1].Known || res[1].Blocks != 2 {
		t.Fatalf("results = %+v, want w0 unknown and w1 holding 2 blocks", res)
	}
	if a.Len() != 2 {
		t.Fatalf("Len = %d, want 2", a.Len())
	}
	// The removed worker's queued record expires without touching anything.
	a.Record("w0", p[:1])
	if got := a.Match(p, []string{"w0"}, nil)[0].Blocks; got != 1 {
		t.Fatalf("re-added worker matches %d, want 1", got)
	}
}

func TestApproxConcurrentRecordAndMatch(t *testing.T) {
	a := NewApprox(ApproxConfig{MaxBlocks: 500})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var out []MatchResult
			for i := 0; i < 300; i++ {
				p := promptHashes(i%17, 1+i%9)
				a.Record([]string{"a", "b", "c"}[g%3], p)
				out = a.Match(p, []string{"a", "b", "c"}, out)
				if a.Len() > 500 {
					t.Errorf("Len %d over MaxBlocks", a.Len())
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

// Both indexes serve the scorer through Matcher.
var _ = []Matcher{(*Index)(nil), (*Approx)(nil)}
