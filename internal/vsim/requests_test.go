package vsim

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/scoring"
)

// TestRequestRecordsCarryTheFloor: a sweep asked for its requests records
// one per first token, each at or above its floor (the same prompt alone on
// an idle engine with the hits it got), and a request that arrives at an
// idle worker with nothing running gets exactly its floor, under both
// timings.
func TestRequestRecordsCarryTheFloor(t *testing.T) {
	w := smallAgent(t)
	for _, timing := range []string{sim.TimingPolynomial, sim.TimingH100Llama3_8B} {
		tm, err := sim.ParseTiming(timing)
		if err != nil {
			t.Fatal(err)
		}
		f := smallFleet()
		f.Timing = tm
		rep, err := Sweep(w, SweepOptions{Fleet: f, Router: scoring.DefaultOptions(), Modes: []string{"kv", "round_robin"},
			Loads: []float64{0.5, 4}, SLO: 2 * time.Second, Seed: 1, Requests: true})
		if err != nil {
			t.Fatal(err)
		}
		if want := 2 * 2 * w.Requests(); len(rep.Records) != want {
			t.Fatalf("%s: %d records, want %d (every request of four runs)", timing, len(rep.Records), want)
		}
		atFloor, queued := 0, 0
		for _, r := range rep.Records {
			if r.TTFTMs < r.FloorMs-1e-3 || !(r.FloorMs > 0) {
				t.Fatalf("%s: %+v: TTFT below its floor", timing, r)
			}
			if r.CachedTokens > r.PromptTokens || r.Worker == "" || (r.Mode != "kv" && r.Mode != "round_robin") {
				t.Fatalf("%s: malformed record %+v", timing, r)
			}
			if math.Abs(r.TTFTMs-r.FloorMs) < 1e-3 {
				atFloor++
			} else if r.Load == 4 {
				queued++
			}
		}
		// The first requests find idle workers; at load 4 some wait.
		if atFloor == 0 || queued == 0 {
			t.Fatalf("%s: %d records at their floor, %d above it at load 4; want some of each", timing, atFloor, queued)
		}
		if rep.Records[0].Request < 0 || rep.Records[0].ArrivalMs < 0 {
			t.Fatalf("%s: first record %+v", timing, rep.Records[0])
		}
	}
}

// The floor prices a prompt's own chunks: one step for a short cold
// prompt, more for a long one, less with a cached prefix, and never
// nothing (the last prompt token is always computed).
func TestFloorMillis(t *testing.T) {
	cfg := sim.EngineConfig{BlockSize: 64, NumGPUBlocks: 5632, MaxNumBatchedTokens: 8192}
	p := sim.Polynomial{}
	one := floorMillis(p, cfg, 1000, 0)
	if want := sim.PrefillMillis(1000); math.Abs(one-want) > 1e-9 { // a prefill-only step: no decode_ms
		t.Errorf("1,000 cold tokens: %g ms, want one step of %g", one, want)
	}
	long := floorMillis(p, cfg, 20000, 0)
	if long <= floorMillis(p, cfg, 8192, 0)*2 || long >= floorMillis(p, cfg, 8192, 0)*3 {
		t.Errorf("20,000 cold tokens: %g ms, want between two and three full steps", long)
	}
	if hit := floorMillis(p, cfg, 20000, 16000); !(hit < long) {
		t.Errorf("a 16,000-token hit costs %g ms, not less than cold %g", hit, long)
	}
	if all := floorMillis(p, cfg, 1000, 1000); !(all > 0) {
		t.Errorf("a full hit costs %g ms; the last token is still computed", all)
	}
}

// TestSweepExplainsTheNamedDecisions: a sweep asked to explain two
// requests records each of their decisions once per run, naming the
// worker the request went to, and routes exactly as without it.
func TestSweepExplainsTheNamedDecisions(t *testing.T) {
	w := smallAgent(t)
	o := SweepOptions{Fleet: smallFleet(), Router: scoring.DefaultOptions(), Modes: []string{"kv"},
		Loads: []float64{1, 4}, SLO: 2 * time.Second, Seed: 1, Requests: true}
	plain, err := Sweep(w, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Explain = map[int]bool{3: true, 7: true}
	rep, err := Sweep(w, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Explains) != 4 {
		t.Fatalf("%d explanations, want 4 (two requests in two runs)", len(rep.Explains))
	}
	went := map[[2]float64]string{}
	for _, r := range rep.Records {
		went[[2]float64{r.Load, float64(r.Request)}] = r.Worker
	}
	for _, e := range rep.Explains {
		if !o.Explain[e.Request] || e.Mode != "kv" || len(e.Explanation.Workers) != smallFleet().Workers || e.Explanation.PromptTokens == 0 {
			t.Fatalf("explanation %+v", e)
		}
		if want := went[[2]float64{e.Load, float64(e.Request)}]; e.Explanation.Chosen != want {
			t.Fatalf("request %d at load %g: explanation chose %s, the run sent it to %s", e.Request, e.Load, e.Explanation.Chosen, want)
		}
	}
	for i := range plain.Sweep["kv"] {
		if a, b := plain.Sweep["kv"][i], rep.Sweep["kv"][i]; a.HitRate != b.HitRate || a.TTFT != b.TTFT {
			t.Fatalf("load %g: explaining changed the run: %+v against %+v", a.Load, b, a)
		}
	}
}
