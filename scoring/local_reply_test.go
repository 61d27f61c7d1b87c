package scoring

import (
	"testing"
	"time"
)

// A worker the proxy answered for (no healthy upstream, overflow) is passed
// over for LocalReplyCooldown, not ejected: it holds the prompt's prefix
// and is the least loaded, yet the picks go elsewhere until the cooldown
// ends; with every worker cooling it is still chosen.
func TestLocalReplyPassesTheWorkerOverForTheCooldown(t *testing.T) {
	clock := newFakeClock()
	r := newTestScheduler(t, testOptions(clock, 1), 2)
	p := r.Pool()
	pick := func() string {
		t.Helper()
		d, err := r.Pick(&Request{Model: "m", PromptTokens: 64}, cands(4, 0), nil)
		if err != nil {
			t.Fatal(err)
		}
		return d.Worker
	}
	if w := pick(); w != "w0" {
		t.Fatalf("before any local reply picked %s, want w0 (it holds the prefix)", w)
	}
	p.ObserveLocalReply("w0")
	if w := pick(); w != "w1" {
		t.Fatalf("right after a local reply for w0 picked %s, want w1", w)
	}
	if _, ejected := p.Ejected("w0"); ejected {
		t.Fatal("a local reply ejected w0")
	}
	if l := mustLoad(t, p, "w0"); !l.Cooling || l.Ejected {
		t.Errorf("w0 load %+v: want cooling, not ejected", l)
	}
	p.ObserveLocalReply("w1")
	if w := pick(); w != "w0" {
		t.Errorf("with both cooling picked %s, want w0 (the prefix decides again)", w)
	}
	clock.Advance(LocalReplyCooldown + time.Millisecond)
	if l := mustLoad(t, p, "w0"); l.Cooling {
		t.Error("w0 still cooling after the cooldown")
	}
	if w := pick(); w != "w0" {
		t.Errorf("after the cooldown picked %s, want w0", w)
	}
	p.ObserveLocalReply("nobody") // unknown workers are ignored
}
