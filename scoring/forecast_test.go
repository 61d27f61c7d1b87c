package scoring

import (
	"fmt"
	"testing"
)

// forecastLoad is w0's Load for a request over hs with matched blocks held
// there.
func forecastLoad(t *testing.T, p *Pool, hs []uint64, matched int) Load {
	t.Helper()
	req := &Request{ID: "probe", Model: "m", PromptTokens: 16 * len(hs), Hashes: hs}
	ls := p.appendLoads(nil, req, []Candidate{{Worker: "w0", MatchedBlocks: matched}}, false)
	if len(ls) != 1 {
		t.Fatalf("%d loads, want 1", len(ls))
	}
	return ls[0]
}

// served runs a request over hs on w0 from dispatch to its end: its
// blocks stored, its first token, its end.
func served(t *testing.T, p *Pool, id string, hs []uint64) {
	t.Helper()
	if err := p.Add(&Request{ID: id, Model: "m", PromptTokens: 16 * len(hs), Hashes: hs}, "w0", 0); err != nil {
		t.Fatal(err)
	}
	p.BlocksStored("w0", hs)
	p.PrefillDone(id)
	p.Free(id)
}

// A 64-block prompt ends on w0 (1,000 blocks): its deepest block joins the
// free queue behind the 936 free blocks, each block above it one place
// further back. A prefill queued since allocates 950 blocks: the 14
// deepest blocks of a prompt matching all 64 go before it runs, and
// nothing of one matching 40. Blocks stored since move the prompt up;
// an active request holding the prefix, or the forecast turned off,
// forecast nothing.
func TestEvictionForecastTakesWhatTheQueueAheadEvicts(t *testing.T) {
	for _, off := range []bool{false, true} {
		clock := newFakeClock()
		o := testOptions(clock, 1)
		o.NoEvictionForecast = off
		p := NewPool(o)
		if err := p.Upsert(spec("w0")); err != nil {
			t.Fatal(err)
		}
		old := hashes(3, 64, 0, 0)
		served(t, p, "old", old)
		probe := append(append([]uint64{}, old...), hashes(4, 0, 16, 9)...)
		if l := forecastLoad(t, p, probe, 64); l.MatchedBlocks != 64 || l.ForecastLostBlocks != 0 {
			t.Fatalf("off=%v, nothing queued: matched %d, lost %d; want 64, 0", off, l.MatchedBlocks, l.ForecastLostBlocks)
		}
		big := hashes(5, 0, 950, 1)
		if err := p.Add(&Request{ID: "big", Model: "m", PromptTokens: 950 * 16, Hashes: big}, "w0", 0); err != nil {
			t.Fatal(err)
		}
		want := 64 - 14
		if off {
			want = 64
		}
		if l := forecastLoad(t, p, probe, 64); l.MatchedBlocks != want || l.ForecastLostBlocks != 64-want {
			t.Fatalf("off=%v, 950 blocks queued ahead: matched %d, lost %d; want %d, %d", off, l.MatchedBlocks, l.ForecastLostBlocks, want, 64-want)
		}
		// Block 39 is stamped through block 31's place: 24 places behind
		// the deepest, 960, out of reach.
		if l := forecastLoad(t, p, probe, 40); l.MatchedBlocks != 40 {
			t.Fatalf("off=%v: a 40-block match lost %d blocks, want none", off, l.ForecastLostBlocks)
		}
		// The big prefill has stored 100 blocks: 850 to go, and the prompt
		// is 100 places further up: the same 14 blocks go.
		p.BlocksStored("w0", big[:100])
		if l := forecastLoad(t, p, probe, 64); l.MatchedBlocks != want {
			t.Fatalf("off=%v, 100 blocks stored since: matched %d, want %d", off, l.MatchedBlocks, want)
		}
		// A request holding the prefix keeps it out of the free queue.
		if err := p.Add(&Request{ID: "user", Model: "m", PromptTokens: 64 * 16, Hashes: old}, "w0", 64); err != nil {
			t.Fatal(err)
		}
		if l := forecastLoad(t, p, probe, 64); l.MatchedBlocks != 64 {
			t.Fatalf("off=%v, prefix in use: matched %d, want 64", off, l.MatchedBlocks)
		}
		p.Free("user")
		// The queue's first token: nothing queued allocates any more.
		p.PrefillDone("big")
		if l := forecastLoad(t, p, probe, 64); l.MatchedBlocks != 64 {
			t.Fatalf("off=%v, the big prefill done: matched %d, want 64", off, l.MatchedBlocks)
		}
	}
}

// The shadow free queue follows the engine: an eviction the events report
// of a stamped block puts the head at that block, and a hit takes its
// blocks out of the middle; both move the prompts behind them up.
func TestEvictionForecastFollowsEvictionsAndHits(t *testing.T) {
	clock := newFakeClock()
	p := NewPool(testOptions(clock, 1))
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	a, b := hashes(3, 64, 0, 0), hashes(6, 64, 0, 0)
	for i, hs := range [][]uint64{a, b} {
		served(t, p, string(rune('a'+i)), hs)
	}
	// 872 free blocks, then a's 64, then b's: b's deepest block is 936th.
	if err := p.Add(&Request{ID: "next", Model: "m", PromptTokens: 937 * 16, Hashes: hashes(8, 0, 937, 3)}, "w0", 0); err != nil {
		t.Fatal(err)
	}
	if l := forecastLoad(t, p, b, 64); l.ForecastLostBlocks != 1 {
		t.Fatalf("937 blocks queued ahead of b's 936th place: lost %d, want 1", l.ForecastLostBlocks)
	}
	p.Free("next")
	// The engine evicts a's deepest block: the 872 blocks ahead of it
	// are gone too, and b's deepest is 63rd.
	p.BlocksRemoved("w0", []uint64{a[63]})
	// A hit on a's first 32 blocks takes them out: b's deepest is 31st.
	if err := p.Add(&Request{ID: "hit", Model: "m", PromptTokens: 32 * 16, Hashes: a[:32]}, "w0", 32); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(&Request{ID: "next2", Model: "m", PromptTokens: 64 * 16, Hashes: hashes(9, 0, 64, 4)}, "w0", 0); err != nil {
		t.Fatal(err)
	}
	if l := forecastLoad(t, p, b, 64); l.ForecastLostBlocks != 33 {
		t.Fatalf("64 blocks queued ahead of b's 31st place: lost %d, want 33", l.ForecastLostBlocks)
	}
}

// forecastMetrics counts Metrics.HitForecastLost.
type forecastMetrics struct {
	NopMetrics
	tokens int
}

func (m *forecastMetrics) HitForecastLost(n int) { m.tokens += n }

// A routed request whose worker's queue will evict part of its hit is sent
// for what is left, and the tokens the forecast took off are counted.
func TestRoutedForecastCountsTheTokensItTookOff(t *testing.T) {
	clock := newFakeClock()
	m := &forecastMetrics{}
	o := testOptions(clock, 1)
	o.Metrics = m
	o.QueueThreshold = 0 // the big prefill saturates the only worker
	r := newTestScheduler(t, o, 1)
	p := r.Pool()
	old := hashes(3, 64, 0, 0)
	served(t, p, "old", old)
	if err := p.Add(&Request{ID: "big", Model: "m", PromptTokens: 950 * 16, Hashes: hashes(5, 0, 950, 1)}, "w0", 0); err != nil {
		t.Fatal(err)
	}
	probe := append(append([]uint64{}, old...), hashes(4, 0, 16, 9)...)
	cs := p.AppendCandidates(nil, "m")
	cs[0].MatchedBlocks = 64
	d, err := r.Route(t.Context(), &Request{ID: "next", Model: "m", PromptTokens: 16 * len(probe), Hashes: probe}, cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.MatchedBlocks != 50 || d.ForecastLostBlocks != 14 {
		t.Fatalf("decision %+v: want 50 blocks matched, 14 forecast lost", d)
	}
	if m.tokens != 14*16 {
		t.Fatalf("HitForecastLost counted %d tokens, want %d", m.tokens, 14*16)
	}
	if got, want := mustLoad(t, p, "w0").PrefillTokens, 950*16+30*16; got != want {
		t.Fatalf("prefill in flight %d tokens, want %d (the request computes what it will not find)", got, want)
	}
}

// A worker that served many requests keeps stamps for what its shadow
// queue can still hold, not for everything it ever served.
func TestEvictionForecastStampsStayBounded(t *testing.T) {
	p := NewPool(testOptions(newFakeClock(), 1))
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		served(t, p, fmt.Sprint("r", i), hashes(uint64(10+i), 64, 0, 0))
	}
	p.mu.RLock()
	w := p.workers["w0"]
	n, limit := len(w.recency), w.stampLimit(1000)
	p.mu.RUnlock()
	if n == 0 || n > limit {
		t.Fatalf("%d stamps after 2,000 requests, want 1 to %d", n, limit)
	}
}
