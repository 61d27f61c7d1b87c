package vsim

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/scoring"
)

// smallAgent is an agent workload small enough for the race detector:
// 80 sessions of 3–8 turns on a 4-worker fleet.
func smallAgent(t testing.TB) *Workload {
	t.Helper()
	o := DefaultAgentOptions()
	o.Sessions, o.MinTurns, o.MaxTurns, o.Rate = 80, 3, 8, 2
	w, err := AgentWorkload(o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func smallFleet() Fleet {
	f := DefaultFleet()
	f.Workers = 4
	return f
}

func run(t testing.TB, w *Workload, mode string, load float64, change func(*scoring.Options)) Result {
	t.Helper()
	o := scoring.DefaultOptions()
	o.Mode = mode
	if change != nil {
		change(&o)
	}
	r, err := Run(w, smallFleet(), o, load, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != w.Requests() || r.Errors != 0 {
		t.Fatalf("%s at load %g: %d requests, %d errors; want all %d served", mode, load, r.Requests, r.Errors, w.Requests())
	}
	return r
}

func TestSweepIsDeterministic(t *testing.T) {
	w := smallAgent(t)
	opt := SweepOptions{Fleet: smallFleet(), Router: scoring.DefaultOptions(), Modes: []string{"kv", "round_robin"},
		Loads: []float64{1, 4}, SLO: 2 * time.Second, Seed: 7}
	var out [2]bytes.Buffer
	for i, par := range []int{1, 3} {
		opt.Parallel = par
		rep, err := Sweep(w, opt)
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteJSON(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		t.Fatalf("two sweeps of the same inputs differ:\n%s\n----\n%s", out[0].String(), out[1].String())
	}
	for _, want := range []string{`"loads": [`, `"slo": {`, `"ttft_p90_ms": 2000`, `"sweep": {`, `"goodput": {`, `"stickiness":`, `"overlap_exact":`} {
		if !strings.Contains(out[0].String(), want) {
			t.Errorf("report lacks %s", want)
		}
	}
}

// TestKVKeepsSessionsOnTheirCache is the point of KV-aware routing in
// miniature: kv sends follow-up turns home and reaches the fleet's
// reference hit rate; round robin scatters them.
func TestKVKeepsSessionsOnTheirCache(t *testing.T) {
	w := smallAgent(t)
	f := smallFleet()
	ideal, ok := bench.IdealOf(func(yield func([]int32)) { w.Prompts(f.Engine, yield) }, 64, f.Workers*f.Engine.NumGPUBlocks)
	if !ok || ideal.Fleet < 0.75 {
		t.Fatalf("the workload's fleet reference is %.2f, want a high-reuse workload", ideal.Fleet)
	}
	kv := run(t, w, "kv", 1, nil)
	rr := run(t, w, "round_robin", 1, nil)
	if kv.HitRate < 0.9*ideal.Fleet {
		t.Errorf("kv hit rate %.3f < 90 %% of the fleet reference %.3f", kv.HitRate, ideal.Fleet)
	}
	if kv.Stickiness < 0.9 || rr.Stickiness > 0.6 {
		t.Errorf("stickiness kv %.2f (want ≥ 0.9), round robin %.2f (want < 0.6)", kv.Stickiness, rr.Stickiness)
	}
	if kv.OverlapExact < 0.95 {
		t.Errorf("kv predicted the engines' cached tokens exactly for %.2f of requests, want ≥ 0.95", kv.OverlapExact)
	}
	if kv.TTFT.P90 >= rr.TTFT.P90 {
		t.Errorf("kv TTFT p90 %.0f ms is not below round robin's %.0f ms", kv.TTFT.P90, rr.TTFT.P90)
	}
}

// TestLearnedRatesMatchTheSimulator checks the latency cost model's online
// fit against the simulator's own prefill speed: what the fit predicts for
// a prompt alone on a worker against the least-squares line through the
// timing model's time to first token of such a request.
func TestLearnedRatesMatchTheSimulator(t *testing.T) {
	w, err := NoReuseWorkload(NoReuseOptions{Requests: 1000, MinPrompt: 256, MaxPrompt: 16000, MinOutput: 1, MaxOutput: 4, Rate: 2, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, w, "kv", 1, func(o *scoring.Options) { o.CostModel = scoring.CostLatency })
	trueRate, trueOverhead := TruePrefillModel(smallFleet().Engine, nil, 256, 16000)
	t.Logf("simulator: %.0f tokens/s, overhead %.1f ms", trueRate, 1000*trueOverhead)
	for _, f := range r.Fits {
		t.Logf("%+v", f)
		if f.Samples < 30 {
			t.Fatalf("%s learned from %d samples only", f.Worker, f.Samples)
		}
		// The fit is a plane (tokens and attention): compare what it
		// predicts for a prompt alone with the simulator's line.
		for _, n := range []float64{1000, 4000, 8000, 16000} {
			got := f.OverheadSeconds + n/f.PrefillRate + f.ContextSeconds*n*n/2
			want := trueOverhead + n/trueRate
			if math.Abs(got-want) > max(0.10*want, 0.005) {
				t.Errorf("%s: predicts %.1f ms for %.0f tokens alone, simulator %.1f ms (more than 10 %% and 5 ms off)", f.Worker, 1000*got, n, 1000*want)
			}
		}
	}
}

func TestQueueShedsInVirtualTime(t *testing.T) {
	w, err := NoReuseWorkload(NoReuseOptions{Requests: 300, MinPrompt: 6000, MaxPrompt: 8000, MinOutput: 10, MaxOutput: 20, Rate: 200, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	o := scoring.DefaultOptions()
	o.Mode = "least_loaded"
	o.QueueThreshold, o.QueueMaxWait = 1, 500*time.Millisecond
	f := smallFleet()
	f.Workers = 1
	r, err := Run(w, f, o, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Shed == 0 || r.Errors != r.Shed || len(r.Fits) != 1 {
		t.Fatalf("shed %d, errors %d: a flood on one worker must be shed by the queue's max wait", r.Shed, r.Errors)
	}
	// Admitted requests waited at most the max wait plus their own prefill.
	if r.TTFT.P99 > 500+3000 {
		t.Errorf("TTFT p99 %.0f ms: the admitted requests waited longer than the queue allows", r.TTFT.P99)
	}
}

func TestRunRejectsWhatCannotWork(t *testing.T) {
	w := smallAgent(t)
	o := scoring.DefaultOptions()
	if _, err := Run(w, smallFleet(), o, 0, 1); err == nil {
		t.Error("load 0 accepted")
	}
	if _, err := Run(w, Fleet{}, o, 1, 1); err == nil {
		t.Error("a fleet of no workers accepted")
	}
	o.Mode = "nonsense"
	if _, err := Run(w, smallFleet(), o, 1, 1); err == nil {
		t.Error("an unknown mode accepted")
	}
	if _, err := Sweep(w, SweepOptions{Fleet: smallFleet(), Router: o, Modes: []string{"kv"}, Loads: []float64{2, 1}}); err == nil {
		t.Error("descending loads accepted")
	}
}

func TestPromptsFollowTheEngine(t *testing.T) {
	// A follow-up turn's prompt starts with the previous prompt and the
	// tokens the engine generated for it, so the engine's cache matches.
	w := smallAgent(t)
	cfg := sim.EngineConfig{BlockSize: 64}
	var got [][]int32
	w.Prompts(cfg, func(p []int32) {
		if len(got) < 200 {
			got = append(got, append([]int32(nil), p...))
		}
	})
	if len(got) == 0 {
		t.Fatal("no prompts")
	}
	eng, err := sim.NewEngine(sim.EngineConfig{BlockSize: 64, NumGPUBlocks: 4096}, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := got[0]
	out := w.Sessions[0].Turns[0].Output
	if err := eng.Add(1, append([]int32(nil), first...), out); err != nil {
		t.Fatal(err)
	}
	var gen []int32
	for eng.HasWork() {
		for _, o := range eng.Step().Outputs {
			gen = append(gen, o.Token)
		}
	}
	want := sim.AppendGenerated(cfg, first, out, nil)
	if !slicesEqual(gen, want) {
		t.Fatalf("AppendGenerated disagrees with the engine's output")
	}
}

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestBenchWorkloadCarriesTheHistory(t *testing.T) {
	w := smallAgent(t)
	cfg := sim.EngineConfig{BlockSize: 64}
	bw := w.BenchWorkload(cfg, "m", 5, 100)
	if n := bw.Requests(); n == 0 || n > 100 {
		t.Fatalf("%d requests, want some and at most 100", n)
	}
	fl := bw.Flows[0]
	if fl.Think != w.Sessions[0].Think/5 || fl.At != w.Sessions[0].Start/5 {
		t.Fatalf("flow timing %v/%v not scaled by 5", fl.At, fl.Think)
	}
	if fl.Items[0].Follows != nil || fl.Items[1].Follows == nil || *fl.Items[1].Follows != (bench.ItemRef{Flow: 0, Item: 0}) {
		t.Fatalf("follow-ups: %v, %v; want the second turn to follow the first", fl.Items[0].Follows, fl.Items[1].Follows)
	}
	first, second := fl.Items[0].Prompt, fl.Items[1].Prompt
	gen := sim.AppendGenerated(cfg, first, fl.Items[0].OutputLen, nil)
	if len(second) <= len(first)+len(gen) || !slicesEqual(second[:len(first)], first) || !slicesEqual(second[len(first):len(first)+len(gen)], gen) {
		t.Fatal("the second turn does not start with the first turn's prompt and generated output")
	}
}

// TestPendingOverlayPlacesABurst: sessions sharing six system prompts
// start together, before any engine has stored a prompt, on four workers
// with vLLM's 16-token blocks. Learning only from KV events, the router
// scatters them; counting what it has just sent where (the pending
// overlay), it sends each group where its prompt is being computed, as a
// router that records its decisions does, and keeps the sessions there.
func TestPendingOverlayPlacesABurst(t *testing.T) {
	w, err := BurstWorkload(DefaultBurstOptions())
	if err != nil {
		t.Fatal(err)
	}
	f := smallFleet()
	f.Engine.BlockSize, f.Engine.NumGPUBlocks = 16, 22528
	runOn := func(mode string, ttl time.Duration) Result {
		o := scoring.DefaultOptions()
		o.Mode, o.PendingTTL = mode, ttl
		r, err := Run(w, f, o, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Errors != 0 {
			t.Fatalf("%s: %d errors", mode, r.Errors)
		}
		return r
	}
	on := runOn("kv", scoring.DefaultPendingTTL)
	off := runOn("kv", 0)
	recorded := runOn("kv_without_events", 0)
	t.Logf("first turns / later turns / same worker: overlay %.3f / %.3f / %.2f, without %.3f / %.3f / %.2f, recorded decisions %.3f / %.3f / %.2f",
		on.FirstTurnHitRate, on.FollowUpHitRate, on.SameWorker, off.FirstTurnHitRate, off.FollowUpHitRate, off.SameWorker,
		recorded.FirstTurnHitRate, recorded.FollowUpHitRate, recorded.SameWorker)
	if on.FirstTurnHitRate < 0.75 || on.FirstTurnHitRate < off.FirstTurnHitRate+0.15 {
		t.Errorf("first-turn hit rate %.3f with the overlay, %.3f without: want ≥ 0.75 and 15 points more", on.FirstTurnHitRate, off.FirstTurnHitRate)
	}
	if on.FirstTurnHitRate < recorded.FirstTurnHitRate-0.01 {
		t.Errorf("first-turn hit rate %.3f below the %.3f of a router recording its decisions", on.FirstTurnHitRate, recorded.FirstTurnHitRate)
	}
	if on.FollowUpHitRate < off.FollowUpHitRate || on.SameWorker < 0.9 {
		t.Errorf("later turns: hit rate %.3f (without the overlay %.3f), %.2f on the previous worker (want ≥ 0.9)", on.FollowUpHitRate, off.FollowUpHitRate, on.SameWorker)
	}
	if on.OverlapExact < 0.99 {
		t.Errorf("predicted cached tokens exact for %.2f of requests, want all: pending blocks are computed by the time the engine looks", on.OverlapExact)
	}
	if on.TTFT.P90 > off.TTFT.P90 {
		t.Errorf("TTFT p90 %.0f ms with the overlay, %.0f ms without", on.TTFT.P90, off.TTFT.P90)
	}
}

// TestRunsUseTheFleetTiming: the same workload under the H100 profile
// takes the profile's time, and the simulator's own prefill fit (what the
// latency cost learns) follows the profile rather than the polynomial.
func TestRunsUseTheFleetTiming(t *testing.T) {
	h100, err := sim.ParseTiming(sim.TimingH100Llama3_8B)
	if err != nil {
		t.Fatal(err)
	}
	p := h100.(*sim.Profile)
	w, err := NoReuseWorkload(NoReuseOptions{Requests: 1, MinPrompt: 4096, MaxPrompt: 4096, MinOutput: 1, MaxOutput: 1, Rate: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	o := scoring.DefaultOptions()
	o.Mode = "round_robin"
	f := smallFleet()
	f.EventLag = 0
	poly, err := Run(w, f, o, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.Timing = h100
	prof, err := Run(w, f, o, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	// One request of 4,096 tokens alone: one prefill step, which samples
	// its only token.
	n := 4096.0
	want := p.Prefill.PassMillis + p.Prefill.PerTokenMillis*n + p.Prefill.AttentionMillis*n*n/2
	if math.Abs(prof.TTFT.P50-want) > 0.01 {
		t.Errorf("TTFT under the profile %.3f ms, want %.3f", prof.TTFT.P50, want)
	}
	if wantPoly := sim.PrefillMillis(4096); math.Abs(poly.TTFT.P50-wantPoly) > 0.01 { // prefill only: no decode_ms
		t.Errorf("TTFT under the polynomial %.3f ms, want %.3f", poly.TTFT.P50, wantPoly)
	}

	rate, overhead := TruePrefillModel(f.Engine, h100, 256, 8000)
	polyRate, _ := TruePrefillModel(f.Engine, nil, 256, 8000)
	// Within one chunk the profile's time is quadratic in n: the line's
	// slope lies between the per-token cost and that plus attention over
	// the largest prompt.
	msPerToken := 1000 / rate
	if lo, hi := p.Prefill.PerTokenMillis, p.Prefill.PerTokenMillis+p.Prefill.AttentionMillis*8000; msPerToken < lo || msPerToken > hi {
		t.Errorf("profile prefill slope %.5f ms/token, want within [%.5f, %.5f]", msPerToken, lo, hi)
	}
	if math.Abs(rate/polyRate-1) < 0.05 || math.IsNaN(overhead) {
		t.Errorf("TruePrefillModel gives %.0f tokens/s under the profile and %.0f under the polynomial: the timing is ignored", rate, polyRate)
	}
}
