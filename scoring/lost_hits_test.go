package scoring

import (
	"sync"
	"testing"
	"time"
)

// lostMetrics counts Metrics.HitLost.
type lostMetrics struct {
	firstTokenMetrics
	mu     sync.Mutex
	tokens int
}

func (m *lostMetrics) HitLost(n int) {
	m.mu.Lock()
	m.tokens += n
	m.mu.Unlock()
}

// A request sent for the 6 blocks its worker held: the worker evicts the
// deepest one before it runs, then (in one batch) the next three with an
// unrelated block. Each eviction grows the request's prefill and the
// worker's backlog by what the engine will compute again; blocks it was
// not counted as holding, another worker's removals and removals after
// its first token change nothing.
func TestEvictedHitGrowsThePrefillItWasSentFor(t *testing.T) {
	clock := newFakeClock()
	m := &lostMetrics{}
	o := testOptions(clock, 1)
	o.Metrics = m
	p := NewPool(o)
	for _, id := range []string{"w0", "w1"} {
		if err := p.Upsert(spec(id)); err != nil {
			t.Fatal(err)
		}
	}
	hs := hashes(7, 0, 8, 1)
	prompt := 8*16 + 5
	if err := p.Add(&Request{ID: "a", Model: "m", PromptTokens: prompt, Hashes: hs}, "w0", 6); err != nil {
		t.Fatal(err)
	}
	backlog := func() float64 { return mustLoad(t, p, "w0").PrefillBacklog }
	want := float64(prompt - 6*16)
	if got := backlog(); got != want {
		t.Fatalf("backlog at dispatch %v, want %v", got, want)
	}
	p.BlocksRemoved("w0", hs[6:])            // never counted as held
	p.BlocksRemoved("w1", hs[:6])            // another worker
	p.BlocksRemoved("w0", hs[3:5])           // not the deepest held block: it goes first
	p.BlocksRemoved("w0", []uint64{1 << 61}) // unrelated
	if got := backlog(); got != want {
		t.Fatalf("backlog after removals that cost nothing %v, want %v", got, want)
	}
	p.BlocksRemoved("w0", []uint64{hs[5]})
	want += 16
	if got := backlog(); got != want {
		t.Fatalf("backlog after the deepest held block went %v, want %v", got, want)
	}
	// One batch takes blocks 2 to 4, in any order, with an unrelated one:
	// the hit is blocks 0 and 1.
	p.BlocksRemoved("w0", []uint64{hs[2], 1 << 62, hs[4], hs[3]})
	want = float64(prompt - 2*16)
	if got := backlog(); got != want {
		t.Fatalf("backlog after blocks 2 to 4 went %v, want %v (blocks 0 and 1 left)", got, want)
	}
	if got, lost := m.tokens, 4*16; got != lost {
		t.Errorf("HitLost counted %d tokens, want %d", got, lost)
	}
	clock.Advance(10 * time.Millisecond)
	p.PrefillDone("a")
	p.BlocksRemoved("w0", hs[:2])
	if got := mustLoad(t, p, "w0").PrefillBacklog; got != 0 {
		t.Errorf("backlog after the first token and a removal %v, want 0", got)
	}
	p.Free("a")
	if got := mustLoad(t, p, "w0").PrefillBacklog; got != 0 {
		t.Errorf("backlog after the end %v, want 0", got)
	}
}
