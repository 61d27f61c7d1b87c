package scoring

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestRatesLearnThePassTerm feeds a worker whose first tokens come at
// overhead + new ÷ rate + context × attention, plus a fixed cost for each
// pass (1,024 tokens in this spec) run while another request is active:
// what an engine pays that adds a decode step to every pass it shares.
// The fit finds the pass cost beside the others, and the cost model
// charges it only where others are active.
func TestRatesLearnThePassTerm(t *testing.T) {
	const trueRate, trueOverhead, trueContext, truePass = 57000.0, 0.005, 1.7e-9, 0.012
	clock := newFakeClock()
	o := testOptions(clock, 1)
	r := newTestScheduler(t, o, 2)
	p := r.Pool()
	const bs = 16
	for i := range 800 {
		newTokens := 128 + (i*7919)%8000
		cachedBlocks := (i * 104729) % 500
		shared := i%3 != 0
		if shared {
			// A request decoding beside the prefill: all of its prompt
			// cached, so it adds no backlog.
			if err := p.Add(&Request{ID: fmt.Sprint("d", i), PromptTokens: 160}, "w0", 10); err != nil {
				t.Fatal(err)
			}
		}
		id := fmt.Sprint("r", i)
		if err := p.Add(&Request{ID: id, PromptTokens: newTokens + cachedBlocks*bs}, "w0", cachedBlocks); err != nil {
			t.Fatal(err)
		}
		secs := trueOverhead + float64(newTokens)/trueRate + trueContext*attentionWork(newTokens, cachedBlocks*bs)
		if shared {
			secs += truePass * math.Ceil(float64(newTokens)/1024)
		}
		clock.Advance(time.Duration(secs * float64(time.Second)))
		p.PrefillDone(id)
		p.Free(id)
		p.Free(fmt.Sprint("d", i))
	}
	f := p.Fits()[0]
	if math.Abs(f.PassSeconds/truePass-1) > 0.03 || math.Abs(f.PrefillRate/trueRate-1) > 0.03 ||
		math.Abs(f.ContextSeconds/trueContext-1) > 0.05 || math.Abs(f.OverheadSeconds-trueOverhead) > 0.002 {
		t.Fatalf("fit %+v, want rate %g overhead %g context %g pass %g", f, trueRate, trueOverhead, trueContext, truePass)
	}
	// w1 learned nothing of its own; both blend toward the fleet's fit.
	l0 := mustLoad(t, p, "w0")
	if l0.PrefillPass != f.PassSeconds {
		t.Fatalf("load shows pass %g, want the fit's %g", l0.PrefillPass, f.PassSeconds)
	}
	// The cost charges the pass only where another request is active:
	// 4,000 tokens are 4 passes of 1,024.
	if err := p.Add(&Request{ID: "busy", PromptTokens: 160}, "w1", 10); err != nil {
		t.Fatal(err)
	}
	exp := &Explanation{}
	if _, err := r.Pick(&Request{ID: "next", PromptTokens: 4000}, p.AppendCandidates(nil, "m"), exp); err != nil {
		t.Fatal(err)
	}
	for _, w := range exp.Workers {
		lw := mustLoad(t, p, w.Worker)
		want := 0.0
		if lw.ActiveRequests > 0 {
			want = 4 * lw.PrefillPass
		}
		kv := o.DecodeKVCost * decodeKVWork(4000, lw.KVUsedBlocks()*lw.BlockSize, lw.MaxNumBatchedTokens)
		if math.Abs(w.DecodeKVSeconds-kv-want) > 1e-12 || w.PrefillPass != lw.PrefillPass {
			t.Fatalf("%s (%d active): decode KV seconds %g, want %g + %g; pass %g, want %g", w.Worker, lw.ActiveRequests, w.DecodeKVSeconds, kv, want, w.PrefillPass, lw.PrefillPass)
		}
	}
	if mustLoad(t, p, "w1").PrefillPass <= 0 {
		t.Fatal("w1 does not carry the fleet's pass cost")
	}
}

// TestRateFitKeepsThePassOffWithoutSharedPasses: samples that never share
// a pass leave the pass cost at its prior, 0, whatever their noise.
func TestRateFitKeepsThePassOffWithoutSharedPasses(t *testing.T) {
	f := newRateFit(20000, 25*time.Millisecond, DefaultPrefillContextCost)
	for i := range 400 {
		n := float64(500 + (i*37)%9000)
		f.add(n, attentionWork(int(n), 0), 0, 0.01+n/40000*(1+0.1*math.Sin(float64(i))))
	}
	if f.pass != 0 || !(f.rate > 0) {
		t.Fatalf("fit %+v: want no pass cost", f)
	}
	// A few shared passes are not enough to fit it either.
	for range 10 {
		f.add(5000, attentionWork(5000, 0), 1, 0.2)
	}
	if f.pass != 0 {
		t.Fatalf("pass %g after 10 shared samples, want 0 until minPassSquares", f.pass)
	}
}

// TestSolveNormalMatchesAKnownPlane solves the normal equations of points
// on a known plane, for every subset of terms the fit uses.
func TestSolveNormalMatchesAKnownPlane(t *testing.T) {
	var m [fitTerms][fitTerms]float64
	var b [fitTerms]float64
	want := [fitTerms]float64{0.02, 1.0 / 30000, 0.004, 0.011}
	for i := range 50 {
		v := [fitTerms]float64{1, float64(100 + i*311%7000), float64(i*i%97) / 10, float64(i % 5)}
		y := 0.0
		for k := range v {
			y += want[k] * v[k]
		}
		for r := range v {
			for c := range v {
				m[r][c] += v[r] * v[c]
			}
			b[r] += v[r] * y
		}
	}
	c, ok := solveNormal(&m, &b, []int{0, 1, 2, 3})
	for k := range c {
		if !ok || math.Abs(c[k]-want[k]) > 1e-9*math.Max(1, math.Abs(want[k])*1e3) {
			t.Fatalf("solve = %v, %v; want %v", c, ok, want)
		}
	}
	if _, ok := solveNormal(&[fitTerms][fitTerms]float64{}, &b, []int{0, 1}); ok {
		t.Fatal("a singular system solved")
	}
}

// TestRateFitKeepsThePassOffWhenEveryPassIsShared: on a saturated worker
// every prefill has requests beside it, so nothing tells the pass cost
// from the rate; the fit keeps it at 0 and learns the rate alone.
func TestRateFitKeepsThePassOffWhenEveryPassIsShared(t *testing.T) {
	f := newRateFit(20000, 25*time.Millisecond, DefaultPrefillContextCost)
	for i := range 400 {
		n := 500 + (i*37)%30000
		d := math.Ceil(float64(n) / 8192)
		f.add(float64(n), attentionWork(n, 0), d, 0.01+float64(n)/40000+0.015*d)
	}
	if f.pass != 0 || !(f.rate > 0) {
		t.Fatalf("fit %+v: want no pass cost where every pass is shared", f)
	}
	// Once a tenth of the prefills run alone, the pass cost is fitted.
	for i := range 200 {
		n := 500 + (i*37)%30000
		d := math.Ceil(float64(n) / 8192)
		if i%3 == 0 {
			d = 0
		}
		f.add(float64(n), attentionWork(n, 0), d, 0.01+float64(n)/40000+0.015*d)
	}
	if math.Abs(f.pass-0.015) > 0.002 {
		t.Fatalf("pass %g, want 0.015 once prefills also run alone", f.pass)
	}
}
