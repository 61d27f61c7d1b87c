package scoring

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestRatesLearnTheContextTerm feeds a worker whose first tokens come at
// overhead + new ÷ rate + context × attention, over prompts with and
// without cached prefixes, and checks the fit finds all three.
func TestRatesLearnTheContextTerm(t *testing.T) {
	const trueRate, trueOverhead, trueContext = 57000.0, 0.005, 1.7e-9
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.PrefillContextCost = 5e-10 // a prior off by 3.4×
	r := newTestScheduler(t, o, 1)
	p := r.Pool()
	const bs = 16
	for i := range 600 {
		newTokens := 128 + (i*7919)%8000
		cachedBlocks := (i * 104729) % 2000 // up to 32k cached tokens
		id := fmt.Sprint("r", i)
		if err := p.Add(&Request{ID: id, PromptTokens: newTokens + cachedBlocks*bs}, "w0", cachedBlocks); err != nil {
			t.Fatal(err)
		}
		secs := trueOverhead + float64(newTokens)/trueRate + trueContext*attentionWork(newTokens, cachedBlocks*bs)
		clock.Advance(time.Duration(secs * float64(time.Second)))
		p.PrefillDone(id)
		p.Free(id)
	}
	f := p.Fits()[0]
	if math.Abs(f.PrefillRate/trueRate-1) > 0.02 || math.Abs(f.ContextSeconds/trueContext-1) > 0.02 || math.Abs(f.OverheadSeconds-trueOverhead) > 0.001 {
		t.Fatalf("fit %+v, want rate %g overhead %g context %g", f, trueRate, trueOverhead, trueContext)
	}
	if l := mustLoad(t, p, "w0"); l.PrefillContext != f.ContextSeconds {
		t.Fatalf("load shows context %g, want the fit's %g", l.PrefillContext, f.ContextSeconds)
	}
}

// TestRateFitWithoutContextPrior: a prior context cost of 0 keeps the
// fit a line in tokens, whatever the observations say.
func TestRateFitWithoutContextPrior(t *testing.T) {
	f := newRateFit(20000, 25*time.Millisecond, 0)
	for i := range 200 {
		n := float64(500 + i*40)
		f.add(n, n*n/2, 0, 0.01+n/40000+1e-9*n*n/2)
	}
	if f.context != 0 || !(f.rate > 20000) {
		t.Fatalf("fit %+v: want no context term and a rate learned from the line", f)
	}
}

// TestBacklogCountsCachedContext: two workers hold the same uncached
// tokens in prefill, but w0's requests attend to long cached prefixes. Its
// backlog carries that attention, drains by the time the whole model
// predicts, and makes it the more expensive candidate.
func TestBacklogCountsCachedContext(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.PrefillRate, o.PrefillContextCost, o.NoLearnRates = 10000, 1e-8, true
	o.PrefillOverhead = 40 * time.Millisecond
	o.DuplicatePrefillWeight, o.CacheChurnWeight = 0, 0
	r := newTestScheduler(t, o, 2)
	p := r.Pool()
	// w0: 2,000 new tokens over 2,000 cached (125 blocks of 16); w1: the
	// same 2,000 new tokens cold.
	if err := p.Add(&Request{ID: "long", PromptTokens: 4000}, "w0", 125); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(&Request{ID: "short", PromptTokens: 2000}, "w1", 0); err != nil {
		t.Fatal(err)
	}
	l0, l1 := mustLoad(t, p, "w0"), mustLoad(t, p, "w1")
	if l0.PrefillBacklog != 2000 || l1.PrefillBacklog != 2000 {
		t.Fatalf("backlog tokens %g and %g, want 2000 each", l0.PrefillBacklog, l1.PrefillBacklog)
	}
	if want := attentionWork(2000, 2000); l0.PrefillBacklogAttention != want {
		t.Fatalf("w0's backlog attention %g, want %g", l0.PrefillBacklogAttention, want)
	}
	// w0's backlog is predicted at 0.04 s + 0.2 s + 1e-8 × 6e6 = 0.3 s:
	// after 0.15 s half of it remains.
	clock.Advance(150 * time.Millisecond)
	if l := mustLoad(t, p, "w0"); math.Abs(l.PrefillBacklog-1000) > 1e-6 || math.Abs(l.PrefillBacklogAttention-attentionWork(2000, 2000)/2) > 1e-3 {
		t.Fatalf("after half its predicted time w0's backlog is %g tokens, %g pairs; want half of each", l.PrefillBacklog, l.PrefillBacklogAttention)
	}
	exp := &Explanation{}
	d, err := r.Pick(&Request{ID: "next", PromptTokens: 1000}, r.Pool().AppendCandidates(nil, "m"), exp)
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != "w1" {
		t.Fatalf("picked %s, want w1 (w0's queue attends to a long context)", d.Worker)
	}
	for _, w := range exp.Workers {
		if !(w.ContextSeconds > 0) || w.ContextSeconds >= w.PredictedTTFT {
			t.Fatalf("explanation of %s: context %g s of a %g s prediction; want a positive part", w.Worker, w.ContextSeconds, w.PredictedTTFT)
		}
	}
}

// TestChurnSpreadsColdPrompts: of two idle workers, the one that took
// fewer uncached tokens lately gets the next cold prompt, and the churn
// halves every churnHalfLife.
func TestChurnSpreadsColdPrompts(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.NoLearnRates = true
	r := newTestScheduler(t, o, 2)
	p := r.Pool()
	// w0 took 60k cold tokens, w1 20k; all finished.
	for i, w := range []string{"w0", "w0", "w0", "w1"} {
		id := fmt.Sprint("old", i)
		if err := p.Add(&Request{ID: id, PromptTokens: 20000}, w, 0); err != nil {
			t.Fatal(err)
		}
		p.PrefillDone(id)
		p.Free(id)
	}
	l0, l1 := mustLoad(t, p, "w0"), mustLoad(t, p, "w1")
	if l0.Churn != 60000 || l1.Churn != 20000 {
		t.Fatalf("churn %g and %g, want 60000 and 20000", l0.Churn, l1.Churn)
	}
	pick := func() string {
		t.Helper()
		d, err := r.Pick(&Request{ID: fmt.Sprint("cold", clock.Now().UnixNano()), PromptTokens: 4000}, r.Pool().AppendCandidates(nil, "m"), nil)
		if err != nil {
			t.Fatal(err)
		}
		return d.Worker
	}
	if got := pick(); got != "w1" {
		t.Fatalf("cold prompt went to %s, want w1 (w0's cache turned over faster)", got)
	}
	clock.Advance(churnHalfLife)
	if l := mustLoad(t, p, "w0"); math.Abs(l.Churn-30000) > 1e-6 {
		t.Fatalf("w0's churn a half-life later %g, want 30000", l.Churn)
	}
}

// TestChurnSurvivesLongUptime: churn weights are rebased before they can
// overflow, and what a worker took long ago has decayed away.
func TestChurnSurvivesLongUptime(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	r := newTestScheduler(t, o, 2)
	p := r.Pool()
	for i := range 1200 { // 20 hours, a request a minute on each worker
		for _, w := range []string{"w0", "w1"} {
			id := fmt.Sprint(w, "-", i)
			if err := p.Add(&Request{ID: id, PromptTokens: 1000}, w, 0); err != nil {
				t.Fatal(err)
			}
			p.Free(id)
		}
		clock.Advance(time.Minute)
	}
	// A request a half-life: the churn converges to 1000 × (1 + ½ + ¼ …).
	for _, w := range []string{"w0", "w1"} {
		if got := mustLoad(t, p, w).Churn; math.IsInf(got, 0) || math.IsNaN(got) || math.Abs(got-1000) > 1e-6*1000 {
			t.Fatalf("%s's churn after 20 hours %g, want 1000 (the last request, a half-life ago, plus what decayed)", w, got)
		}
	}
}
