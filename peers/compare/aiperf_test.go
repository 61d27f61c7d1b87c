//go:build compare

// This file: an independent client. NVIDIA's aiperf replays a slice of the
// Mooncake conversation trace through Envoy + kvroute + kvsim; then, on
// cleared caches, kvbench's client (bench.Run, trace arrival) replays the
// very requests aiperf sent, at the same times; then kvbench's own trace
// workload (token-id prompts, as `kvbench replay` sends them). The two
// clients' TTFT and inter-token latency should agree.
//
// Run by `make compare`; by hand:
//
//	KVROUTE_PEERS_PY=.../venv/bin/python KVROUTE_ENVOY=... \
//	  go test -tags compare -run TestAIPerf -v -timeout 20m ./peers/compare -args -out DIR
package compare

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
)

var (
	aiperfRequests  = flag.Int("aiperf-requests", 100, "records of the bundled Mooncake conversation trace the aiperf comparison replays")
	aiperfTimeScale = flag.Float64("aiperf-time-scale", 1, "divide the trace's timestamps by this in the aiperf comparison")
	aiperfSpeedup   = flag.Float64("aiperf-speedup", 2, "divide the aiperf comparison's simulated step times by this: at 2 the fleet has twice the trace's capacity, which keeps queueing, and run-to-run spread, low")
	aiperfAgain     = flag.Bool("aiperf-kvbench-again", true, "replay aiperf's requests with kvbench's client a second time: how far two runs of one client differ")
	aiperfTokenIDs  = flag.Bool("aiperf-token-ids", false, "also replay kvbench's own token-id prompts of the same records (one more run)")
)

// aiperfGPUBlocks is each worker's KV cache: 256k tokens, so that every
// prompt of the trace slice fits.
const aiperfGPUBlocks = 16384

// aiperfTolerance is how far apart (relative) the two clients' figures may
// be and still agree.
const aiperfTolerance = 0.10

// aiperfSide is one client's figures for the run.
type aiperfSide struct {
	Client   string  `json:"client"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	HitRate  float64 `json:"hit_rate"`
	TTFTP50  float64 `json:"ttft_p50_ms"`
	TTFTP90  float64 `json:"ttft_p90_ms"`
	// ITLP50 is the median of every inter-token gap of every request
	// pooled: kvbench's ITL, aiperf's inter_chunk_latency (one token a
	// chunk here).
	ITLP50 float64 `json:"itl_p50_ms"`
	ReqS   float64 `json:"req_s"`
	WallS  float64 `json:"duration_s"`
	// SchedLagP90 is how late the client sent requests against the trace's
	// schedule (p90, ms).
	SchedLagP90 float64 `json:"schedule_lag_p90_ms"`
	WorstLagS   float64 `json:"worst_clock_lag_s"`
	LagWarning  bool    `json:"clock_lag_warning"`
	// WorkerTTFT is from the request's send to the worker's writing of the
	// first token (kvsim's stamp); Delivery from there to the client's
	// reading it. TTFT is their sum: Delivery is what the path and the
	// client add.
	WorkerTTFTP50 float64 `json:"worker_ttft_p50_ms"`
	WorkerTTFTP90 float64 `json:"worker_ttft_p90_ms"`
	DeliveryP50   float64 `json:"first_token_delivery_p50_ms"`
	DeliveryP90   float64 `json:"first_token_delivery_p90_ms"`
	// workers is who served each record (by index; "" unknown).
	workers []string
	// ITLRequestP50 is the median over requests of each request's mean
	// inter-token gap: aiperf's inter_token_latency, (latency − TTFT) ÷
	// (tokens − 1).
	ITLRequestP50 float64 `json:"itl_per_request_p50_ms"`
}

// aiperfReport is aiperf.json; markdown renders aiperf.md.
type aiperfReport struct {
	AIPerf    string       `json:"aiperf_version"`
	Envoy     string       `json:"envoy_version"`
	Fleet     string       `json:"fleet"`
	Trace     string       `json:"trace"`
	Records   int          `json:"records"`
	TimeScale float64      `json:"time_scale"`
	Command   string       `json:"aiperf_command"`
	Env       []string     `json:"aiperf_environment"`
	Sides     []aiperfSide `json:"runs"`
	Agreement []string     `json:"agreement"`
	// Spread is kvbench against itself: two runs of the same requests.
	Spread []string `json:"kvbench_run_to_run,omitempty"`
	Agree  bool     `json:"agree_within_10_percent"`
}

func TestAIPerfAgainstKvbench(t *testing.T) {
	py := peersPython(t)
	version := distVersion(t, py, "aiperf")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recs, err := bench.BundledTrace()
	if err != nil {
		t.Fatal(err)
	}
	recs = recs[:min(*aiperfRequests, len(recs))]
	work := t.TempDir()
	tracePath := filepath.Join(work, "trace.jsonl")
	writeScaledTrace(t, tracePath, recs, *aiperfTimeScale)
	hfHome := hubCacheLayout(t, work)
	env := startFleet(t, ctx, aiperfGPUBlocks, *aiperfSpeedup)

	// aiperf first, on the fleet's cold caches.
	artifacts := filepath.Join(work, "artifacts")
	argv := []string{py, "-m", "aiperf", "profile",
		"--model", peerModel, "--tokenizer", peerModel, "--url", env.URL(),
		"--endpoint-type", "chat", "--streaming",
		"--input-file", tracePath, "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
		"--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", "1",
		"--output-artifact-dir", artifacts, "--export-level", "raw",
		"--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry"}
	penv := []string{"HF_HOME=" + hfHome, "HF_HUB_OFFLINE=1"}
	lag0 := fleetLag(env)
	p := startPeer(t, ctx, "aiperf", work, penv, argv...)
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("aiperf: %v\n%s", p.err, p.logTail())
		}
	case <-time.After(4 * time.Minute):
		t.Fatalf("aiperf did not finish in 4 minutes\n%s", p.logTail())
	}
	ap := readAIPerfSummary(t, filepath.Join(artifacts, "profile_export_aiperf.json"))
	ap.WorstLagS, ap.LagWarning = lagSince(env, lag0, time.Duration(ap.WallS*float64(time.Second)))
	sent, firsts, served := aiperfWorkload(t, filepath.Join(artifacts, "profile_export_raw.jsonl"), recs, *aiperfTimeScale)
	ap.setFirstTokens(firsts)
	ap.workers = served

	// kvbench's client on the requests aiperf sent, then on its own
	// token-id prompts of the same records.
	ours := kvbenchReplay(t, ctx, env, "kvbench client, aiperf's requests", sent)
	sides := []aiperfSide{ap, ours}
	var again *aiperfSide
	if *aiperfAgain {
		a := kvbenchReplay(t, ctx, env, "kvbench client, aiperf's requests, again", sent)
		sides, again = append(sides, a), &a
	}
	if *aiperfTokenIDs {
		own := bench.TraceWorkload(recs, bench.TraceOptions{Model: peerModel, TimeScale: *aiperfTimeScale})
		sides = append(sides, kvbenchReplay(t, ctx, env, "kvbench client, kvbench's token-id prompts", own))
	}

	rep := aiperfReport{AIPerf: version, Envoy: envoyVersion(), Fleet: fleetLine(aiperfGPUBlocks, *aiperfSpeedup), Trace: bench.BundledTraceName,
		Records: len(recs), TimeScale: *aiperfTimeScale, Env: penv, Sides: sides}
	rep.Command = shellLine(append([]string{"python"}, redactPaths(argv[1:], work, env.URL())...))
	rep.Env[0] = "HF_HOME=HF" // a temporary Hugging Face cache holding tokenizer/testdata/qwen3 as Qwen/Qwen3-8B
	rep.Agreement, rep.Agree = compareSides(ap, ours, "aiperf", "kvbench")
	rep.Agreement = append(rep.Agreement, sameWorkers(ap, ours, "aiperf's run and kvbench's"))
	if again != nil {
		rep.Spread, _ = compareSides(ours, *again, "kvbench", "kvbench again")
		rep.Spread = append(rep.Spread, sameWorkers(ours, *again, "kvbench's two runs"))
	}
	for _, s := range rep.Sides {
		t.Logf("%s: TTFT p50/p90 %.0f/%.0f ms, ITL p50 %.1f ms, %.2f req/s, hit %.3f, errors %d, schedule lag p90 %.0f ms",
			s.Client, s.TTFTP50, s.TTFTP90, s.ITLP50, s.ReqS, s.HitRate, s.Errors, s.SchedLagP90)
	}
	for _, a := range append(rep.Agreement, rep.Spread...) {
		t.Log(a)
	}
	writeFragment(t, "aiperf", rep.markdown(), rep)
}

// writeScaledTrace writes recs as a Mooncake JSONL trace with timestamps
// divided by scale, so that aiperf and kvbench replay the same schedule.
func writeScaledTrace(t *testing.T, path string, recs []bench.TraceRecord, scale float64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for _, r := range recs {
		r.Timestamp = int64(math.Round(float64(r.Timestamp-recs[0].Timestamp) / scale))
		b, _ := json.Marshal(r)
		w.Write(append(b, '\n'))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// hubCacheLayout lays tokenizer/testdata/qwen3 out as a Hugging Face hub
// cache entry of the model's name and returns the HF_HOME holding it.
// aiperf 0.13.0 loads its tokenizer in worker processes that force
// HF_HUB_OFFLINE=1, and offline it resolves every name, a local directory
// too, as a hub repository id; a cache entry is what it can load offline.
func hubCacheLayout(t *testing.T, dir string) string {
	t.Helper()
	home := filepath.Join(dir, "hf")
	repo := filepath.Join(home, "hub", "models--"+strings.ReplaceAll(peerModel, "/", "--"))
	const rev = "0000000000000000000000000000000000000000"
	snap := filepath.Join(repo, "snapshots", rev)
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(repo, "refs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(rev), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := filepath.Abs(peerTokenizer)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := os.Symlink(filepath.Join(src, name), filepath.Join(snap, name)); err != nil {
			t.Fatal(err)
		}
	}
	return home
}

// aiperfMetric is one metric of aiperf's summary export.
type aiperfMetric struct {
	Avg float64 `json:"avg"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
}

// readAIPerfSummary reads profile_export_aiperf.json.
func readAIPerfSummary(t *testing.T, path string) aiperfSide {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]json.RawMessage
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	metric := func(name string) aiperfMetric {
		var m aiperfMetric
		if raw, ok := s[name]; ok {
			_ = json.Unmarshal(raw, &m)
		}
		return m
	}
	var errs []struct {
		Count int `json:"count"`
	}
	_ = json.Unmarshal(s["error_summary"], &errs)
	side := aiperfSide{Client: "aiperf",
		Requests: int(metric("request_count").Avg), HitRate: metric("overall_usage_prompt_cache_read_pct").Avg / 100,
		TTFTP50: metric("time_to_first_token").P50, TTFTP90: metric("time_to_first_token").P90,
		ITLRequestP50: metric("inter_token_latency").P50, ITLP50: metric("inter_chunk_latency").P50,
		ReqS: metric("request_throughput").Avg, WallS: metric("benchmark_duration").Avg,
		SchedLagP90: metric("replay_sched_lag_p90").Avg}
	for _, e := range errs {
		side.Errors += e.Count
	}
	return side
}

// firstToken is when a request was sent, when the worker wrote its first
// token (the chunk's kvsim_t stamp) and when the client read it, all on
// this host's wall clock.
type firstToken struct{ sent, emitted, received time.Time }

// aiperfWorkload rebuilds, from aiperf's raw export, the requests it sent:
// record i of the trace is aiperf's conversation session_<i>, sent at the
// record's scaled timestamp. It also returns each request's first-token
// times as aiperf recorded them.
func aiperfWorkload(t *testing.T, path string, recs []bench.TraceRecord, scale float64) (*bench.Workload, []firstToken, []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bodies := make([][]byte, len(recs))
	workers := make([]string, len(recs))
	var firsts []firstToken
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	session := regexp.MustCompile(`^session_(\d+)$`)
	for sc.Scan() {
		var line struct {
			Metadata struct {
				Conversation string `json:"conversation_id"`
				StartNs      int64  `json:"request_start_ns"`
			} `json:"metadata"`
			StartPerfNs int64           `json:"start_perf_ns"`
			Payload     json.RawMessage `json:"payload"`
			Responses   []aiperfChunk   `json:"responses"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		m := session.FindStringSubmatch(line.Metadata.Conversation)
		if m == nil {
			t.Fatalf("%s: conversation %q is not session_<n>", path, line.Metadata.Conversation)
		}
		i, _ := strconv.Atoi(m[1])
		if i >= len(recs) {
			t.Fatalf("%s: %s beyond the %d records", path, m[0], len(recs))
		}
		var p struct {
			MaxTokens int `json:"max_completion_tokens"`
		}
		if err := json.Unmarshal(line.Payload, &p); err != nil || p.MaxTokens != recs[i].OutputLength {
			t.Fatalf("%s: %s asks for %d tokens, record %d for %d", path, m[0], p.MaxTokens, i, recs[i].OutputLength)
		}
		bodies[i] = line.Payload
		// aiperf times chunks on the monotonic perf counter; the request's
		// wall-clock start anchors them.
		for _, r := range line.Responses {
			if workers[i] == "" && len(r.Packets) > 0 {
				workers[i] = bench.WorkerFromID([]byte(r.Packets[0].Value))
			}
			if stamp, ok := r.firstContent(); ok {
				firsts = append(firsts, firstToken{sent: time.Unix(0, line.Metadata.StartNs), emitted: time.Unix(0, stamp),
					received: time.Unix(0, line.Metadata.StartNs+r.PerfNs-line.StartPerfNs)})
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	w := &bench.Workload{Name: "aiperf-requests", Params: map[string]any{"records": len(recs), "time_scale": scale}}
	for i, r := range recs {
		if bodies[i] == nil {
			t.Fatalf("%s: no request for record %d", path, i)
		}
		at := time.Duration(float64(r.Timestamp-recs[0].Timestamp) * float64(time.Millisecond) / scale)
		w.Flows = append(w.Flows, bench.Flow{At: at, Items: []bench.Item{{Path: bench.PathChat, Body: bodies[i], OutputLen: r.OutputLength}}})
	}
	return w, firsts, workers
}

// aiperfChunk is one streamed response of aiperf's raw export.
type aiperfChunk struct {
	PerfNs  int64 `json:"perf_ns"`
	Packets []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"packets"`
}

// firstContent reports whether the chunk carries generated text and the
// worker's emit stamp of it.
func (c aiperfChunk) firstContent() (int64, bool) {
	for _, p := range c.Packets {
		if p.Name != "data" {
			continue
		}
		var d struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Stamp int64 `json:"kvsim_t"`
		}
		if json.Unmarshal([]byte(p.Value), &d) == nil && len(d.Choices) > 0 && d.Choices[0].Delta.Content != "" && d.Stamp > 0 {
			return d.Stamp, true
		}
	}
	return 0, false
}

// setFirstTokens fills in the side's split of TTFT: until the worker wrote
// the first token, and from then until the client read it.
func (s *aiperfSide) setFirstTokens(firsts []firstToken) {
	var worker, delivery []float64
	for _, f := range firsts {
		worker = append(worker, float64(f.emitted.Sub(f.sent))/float64(time.Millisecond))
		delivery = append(delivery, float64(f.received.Sub(f.emitted))/float64(time.Millisecond))
	}
	w, d := bench.Summarize(worker), bench.Summarize(delivery)
	s.WorkerTTFTP50, s.WorkerTTFTP90, s.DeliveryP50, s.DeliveryP90 = w.P50, w.P90, d.P50, d.P90
}

// kvbenchReplay clears the caches and replays wl with kvbench's client at
// the workload's times.
func kvbenchReplay(t *testing.T, ctx context.Context, env *bench.Env, name string, wl *bench.Workload) aiperfSide {
	t.Helper()
	if err := env.ResetCaches(ctx); err != nil {
		t.Fatal(err)
	}
	client := bench.NewClient(env.URL())
	defer client.Close()
	rctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	m, results, err := bench.RunOnFleet(rctx, env.Fleet.Workers(), client, wl, bench.RunOptions{Arrival: bench.Arrival{Kind: bench.ArrivalTrace}})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	_, lag := m.WorstLag()
	side := aiperfSide{Client: name, Requests: m.Requests - m.Errors, Errors: m.Errors, HitRate: m.HitRate,
		TTFTP50: m.TTFT.P50, TTFTP90: m.TTFT.P90, ITLP50: m.ITL.P50, ReqS: m.ReqS, WallS: m.WallSeconds,
		SchedLagP90: scheduleLagP90(results, wl), WorstLagS: lag, LagWarning: m.LagWarning}
	var firsts []firstToken
	var perRequest []float64
	side.workers = make([]string, len(wl.Flows))
	for _, r := range results {
		if r.Err != nil {
			continue
		}
		side.workers[r.Ref.Flow] = r.Worker
		if !r.FirstEmit.IsZero() {
			firsts = append(firsts, firstToken{sent: r.Start, emitted: r.FirstEmit, received: r.Start.Add(r.TTFT)})
		}
		if len(r.ITL) > 0 {
			var sum float64
			for _, g := range r.ITL {
				sum += float64(g)
			}
			perRequest = append(perRequest, sum/float64(len(r.ITL)))
		}
	}
	side.setFirstTokens(firsts)
	side.ITLRequestP50 = bench.Summarize(perRequest).P50
	return side
}

// scheduleLagP90 is the p90 of how late each request was sent against its
// flow's At, taking the earliest send as the schedule's origin.
func scheduleLagP90(results []bench.Result, wl *bench.Workload) float64 {
	if len(results) == 0 {
		return 0
	}
	origin := results[0].Start
	for _, r := range results {
		if r.Start.Before(origin) {
			origin = r.Start
		}
	}
	var lags []float64
	for _, r := range results {
		want := origin.Add(wl.Flows[r.Ref.Flow].At)
		lags = append(lags, float64(r.Start.Sub(want))/float64(time.Millisecond))
	}
	return bench.Summarize(lags).P90
}

// fleetLag is each worker's clock lag so far; lagSince the worst growth
// since then and whether it stretched a run of length wall.
func fleetLag(env *bench.Env) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, w := range env.Fleet.Workers() {
		out[w.ID()] = w.Stats().ClockLag
	}
	return out
}

func lagSince(env *bench.Env, before map[string]time.Duration, wall time.Duration) (float64, bool) {
	var worst time.Duration
	for _, w := range env.Fleet.Workers() {
		worst = max(worst, w.Stats().ClockLag-before[w.ID()])
	}
	return worst.Seconds(), bench.LagExceeds(worst, wall)
}

// sameWorkers says how many requests two runs sent to the same worker.
func sameWorkers(a, b aiperfSide, what string) string {
	same, n := 0, 0
	for i := range min(len(a.workers), len(b.workers)) {
		if a.workers[i] == "" || b.workers[i] == "" {
			continue
		}
		n++
		if a.workers[i] == b.workers[i] {
			same++
		}
	}
	return fmt.Sprintf("kvroute sent %d of %d requests to the same worker in %s", same, n, what)
}

// compareSides compares two runs of the same requests, b against a.
func compareSides(a, b aiperfSide, aName, bName string) ([]string, bool) {
	all := true
	var out []string
	for _, c := range []struct {
		what      string
		a, o, tol float64
	}{
		{"TTFT p50", a.TTFTP50, b.TTFTP50, aiperfTolerance},
		{"TTFT p90", a.TTFTP90, b.TTFTP90, aiperfTolerance},
		{"ITL p50, per request (aiperf's inter_token_latency)", a.ITLRequestP50, b.ITLRequestP50, aiperfTolerance},
		{"ITL p50, every gap pooled (kvbench's ITL, aiperf's inter_chunk_latency)", a.ITLP50, b.ITLP50, aiperfTolerance},
	} {
		d := (c.o - c.a) / c.a
		ok := math.Abs(d) <= c.tol
		all = all && ok
		verdict := "agree"
		if !ok {
			verdict = "DISAGREE"
		}
		out = append(out, fmt.Sprintf("%s: %s %.1f ms, %s %.1f ms (%+.1f %%): %s", c.what, aName, c.a, bName, c.o, 100*d, verdict))
	}
	return out, all
}

// tokenIDsNote mentions the runs after the first of kvbench's.
func (r *aiperfReport) tokenIDsNote() string {
	note := ""
	for _, s := range r.Sides {
		if strings.HasSuffix(s.Client, ", again") {
			note = ", then once more"
		}
	}
	if !strings.Contains(r.Sides[len(r.Sides)-1].Client, "token-id") {
		return note
	}
	return note + ", and then kvbench's own prompts for the same records (token ids, as `kvbench replay` sends them)"
}

// split says where the two runs' TTFTs part: in what the worker took to
// write the first token (the system, run to run) or in its delivery to
// the client (the path and the client's own measurement).
func (ap aiperfSide) split(ours aiperfSide) string {
	head := fmt.Sprintf("Where the TTFTs part (kvbench − aiperf): TTFT p50 differs by %+.1f ms, the time until the worker wrote the first token by %+.1f ms "+
		"and its delivery to the client by %+.1f ms; at p90 by %+.1f, %+.1f and %+.1f ms. Between the worker's write and its own read of the first token "+
		"aiperf adds %.1f / %.1f ms and kvbench %.1f / %.1f ms (p50 / p90). ",
		ours.TTFTP50-ap.TTFTP50, ours.WorkerTTFTP50-ap.WorkerTTFTP50, ours.DeliveryP50-ap.DeliveryP50,
		ours.TTFTP90-ap.TTFTP90, ours.WorkerTTFTP90-ap.WorkerTTFTP90, ours.DeliveryP90-ap.DeliveryP90,
		ap.DeliveryP50, ap.DeliveryP90, ours.DeliveryP50, ours.DeliveryP90)
	for _, x := range []aiperfSide{ap, ours} {
		if x.LagWarning {
			head += fmt.Sprintf("The host fell behind during %s's run (the workers' clock lag, %.1f s), which stretches every time in it. ", x.Client, x.WorstLagS)
		}
	}
	// A client's own share of TTFT is its delivery: when the two differ
	// there by less than 5 ms or 2 % of the TTFT, they measure the same
	// thing the same way.
	alike := func(d, ttft float64) bool { return math.Abs(d) < max(5, 0.02*ttft) }
	if alike(ours.DeliveryP50-ap.DeliveryP50, ap.TTFTP50) && alike(ours.DeliveryP90-ap.DeliveryP90, ap.TTFTP90) {
		return head + "The two clients measure alike to within that (under 5 ms or 2 % of TTFT); what differs is the time before the worker wrote " +
			"the first token, that is the fleet answering two runs differently (which worker got which long prompt, and what queued behind it), not a client's error."
	}
	return head + "The clients differ in what they add themselves by more than 5 ms and 2 % of TTFT: that part of the gap is a measurement difference."
}

// redactPaths replaces the run's temporary paths and the Envoy URL in a
// command line with placeholders.
func redactPaths(args []string, work, url string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		a = strings.ReplaceAll(a, work+"/", "")
		out[i] = strings.ReplaceAll(a, url, "http://ENVOY")
	}
	return out
}

// markdown renders aiperf.md.
func (r *aiperfReport) markdown() string {
	var b strings.Builder
	b.WriteString("## An independent client: aiperf\n\n")
	fmt.Fprintf(&b, "aiperf %s (unpatched) replays the first %d records of the %s (timestamps ÷ %g) through Envoy %s + kvroute (kv) + %s, "+
		"on cold caches; then kvbench's client (bench.Run, trace arrival) replays on cleared caches the very requests aiperf sent "+
		"(read back from its raw export) at the same times%s. "+
		"aiperf synthesizes each record's text from its hash ids (512 tokens each) with the Qwen3 tokenizer and sends it to /v1/chat/completions.\n\n",
		r.AIPerf, r.Records, r.Trace, r.TimeScale, r.Envoy, r.Fleet, r.tokenIDsNote())
	b.WriteString("| client | requests | errors | hit rate | TTFT p50 / p90 ms | worker wrote 1st token p50 / p90 ms | 1st token delivery p50 / p90 ms | ITL p50 per request / pooled ms | req/s | schedule lag p90 ms | worst clock lag s |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Sides {
		fmt.Fprintf(&b, "| %s | %d | %d | %.3f | %.0f / %.0f | %.0f / %.0f | %.1f / %.1f | %.1f / %.1f | %.2f | %.0f | %s |\n",
			s.Client, s.Requests, s.Errors, s.HitRate, s.TTFTP50, s.TTFTP90, s.WorkerTTFTP50, s.WorkerTTFTP90, s.DeliveryP50, s.DeliveryP90,
			s.ITLRequestP50, s.ITLP50, s.ReqS, s.SchedLagP90, lagCell(s.WorstLagS, s.LagWarning))
	}
	b.WriteString("\naiperf against kvbench's client on the same requests (tolerance 10 %):\n\n")
	for _, a := range r.Agreement {
		fmt.Fprintf(&b, "- %s\n", a)
	}
	if len(r.Spread) > 0 {
		b.WriteString("\nkvbench's client against itself, a second run of the same requests on cleared caches:\n\n")
		for _, a := range r.Spread {
			fmt.Fprintf(&b, "- %s\n", a)
		}
	}
	b.WriteString("\n" + r.Sides[0].split(r.Sides[1]) + "\n")
	fmt.Fprintf(&b, "\nThe aiperf command (ENVOY is the proxy's address; trace.jsonl the slice written by the test):\n\n    %s %s\n",
		strings.Join(r.Env, " "), r.Command)
	b.WriteString("\nHow the two count: both take the first token as the first streamed chunk with non-empty content (kvsim's first chat chunk carries only the role) " +
		"and time it from the moment the request is sent. aiperf's ITL is per request, (latency − TTFT) ÷ (output tokens − 1), its p50 over requests; " +
		"with --use-server-token-count it takes the output tokens from the server's usage instead of re-tokenizing every response during the run, " +
		"which on 2 cores would take CPU from the fleet it measures. kvbench's ITL p50 is over every gap of every request, timed from the worker's " +
		"emit stamps when the chunks carry them; aiperf's inter-chunk latency is the same statistic on its own receive times. " +
		"Request rate: aiperf divides by its benchmark duration, kvbench by its run's wall time. " +
		"aiperf 0.13.0 loads its tokenizer in worker processes that force HF_HUB_OFFLINE=1, where a local directory passed to --tokenizer is taken for a hub " +
		"repository id and fails to load; the test therefore lays tokenizer/testdata/qwen3 out as a hub cache entry named Qwen/Qwen3-8B (HF_HOME) and passes the name.\n")
	return b.String()
}
