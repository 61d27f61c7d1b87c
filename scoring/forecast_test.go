package scoring

import "testing"

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
		if err := p.Add(&Request{ID: "old", Model: "m", PromptTokens: 64 * 16, Hashes: old}, "w0", 0); err != nil {
			t.Fatal(err)
		}
		p.BlocksStored("w0", old)
		p.PrefillDone("old")
		p.Free("old")
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

// Evictions of stamped blocks teach the worker how far its free queue
// moves per stored block; the forecast scales the blocks stored since a
// stamp by it.
func TestEvictionForecastLearnsTheQueueSpeed(t *testing.T) {
	clock := newFakeClock()
	p := NewPool(testOptions(clock, 1))
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	a, b := hashes(3, 64, 0, 0), hashes(6, 64, 0, 0)
	for i, hs := range [][]uint64{a, b} {
		id := string(rune('a' + i))
		if err := p.Add(&Request{ID: id, Model: "m", PromptTokens: 64 * 16, Hashes: hs}, "w0", 0); err != nil {
			t.Fatal(err)
		}
		p.BlocksStored("w0", hs)
		p.PrefillDone(id)
		p.Free(id)
	}
	// a's deepest block took place 936 with 64 blocks stored; b's took
	// 936 with 128. After 404 more (468 since a's), a's deepest is
	// evicted: the queue moved two places per stored block.
	p.BlocksStored("w0", hashes(7, 0, 404, 2))
	p.BlocksRemoved("w0", []uint64{a[63]})
	p.mu.RLock()
	speed := p.workers["w0"].speed()
	p.mu.RUnlock()
	if speed != 2 {
		t.Fatalf("queue speed %v, want 2", speed)
	}
	// b's deepest block: 936 − 2 × 404 = 128 places left; a prefill of
	// 129 blocks queued ahead evicts it.
	if err := p.Add(&Request{ID: "next", Model: "m", PromptTokens: 129 * 16, Hashes: hashes(8, 0, 129, 3)}, "w0", 0); err != nil {
		t.Fatal(err)
	}
	if l := forecastLoad(t, p, b, 64); l.ForecastLostBlocks != 1 {
		t.Fatalf("b after the queue moved at speed 2: lost %d blocks, want 1", l.ForecastLostBlocks)
	}
}
