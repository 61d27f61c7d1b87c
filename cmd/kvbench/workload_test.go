package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/kvroute/kvroute/internal/sim"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
)

// writeTrace writes n Mooncake records one second apart.
func writeTrace(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"timestamp\": %d, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [%d, %d]}\n", 1000*i, 2*i, 2*i+1)
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// buildDemoWorkload parses demo flags and builds their workload.
func buildDemoWorkload(args ...string) (*workloadFlags, *bench.Workload, bench.Arrival, error) {
	var d demoFlags
	fs := newDemoFlags(&d, io.Discard)
	if err := parse(fs, args, io.Discard); err != nil {
		return nil, nil, bench.Arrival{}, err
	}
	d.wl.parsed(fs)
	wl, arr, err := d.wl.build()
	return &d.wl, wl, arr, err
}

func TestMaxRequestsNeverSilentlyTruncatesATrace(t *testing.T) {
	trace := writeTrace(t, 10)
	bundled, err := bench.BundledTrace()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		requests int
		note     string // "" for no note
	}{
		{"explicit trace is replayed whole", []string{"--trace", trace}, 10, ""},
		{"explicit trace cut by --max-requests says so", []string{"--trace", trace, "--max-requests", "4"}, 4, "first 4 of the 10 requests"},
		{"--max-requests above the trace is no cut", []string{"--trace", trace, "--max-requests", "40"}, 10, ""},
		{"bundled trace default slice says so", []string{"--workload", "trace"}, demoMaxRequests, fmt.Sprintf("first %d of the %d requests of the bundled trace", demoMaxRequests, len(bundled))},
		{"bundled trace whole", []string{"--workload", "trace", "--max-requests", "0"}, len(bundled), ""},
		{"synthetic workload cut says so", []string{"--workload", "shared-prefix", "--groups", "2", "--per-group", "5", "--max-requests", "3"}, 3, "first 3 of the workload's 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, wl, _, err := buildDemoWorkload(tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			notes := strings.Join(w.notes, "\n")
			if wl.Requests() != tc.requests {
				t.Errorf("%d requests, want %d", wl.Requests(), tc.requests)
			}
			if (tc.note == "") != (notes == "") || !strings.Contains(notes, tc.note) {
				t.Errorf("notes %q, want one containing %q", notes, tc.note)
			}
		})
	}
}

func TestLoadScalesArrivalsOnly(t *testing.T) {
	trace := writeTrace(t, 3)
	_, base, _, err := buildDemoWorkload("--trace", trace, "--speedup", "2")
	if err != nil {
		t.Fatal(err)
	}
	w, loaded, _, err := buildDemoWorkload("--trace", trace, "--speedup", "2", "--load", "4")
	if err != nil {
		t.Fatal(err)
	}
	if base.Flows[2].At != time.Second || loaded.Flows[2].At != 250*time.Millisecond {
		t.Errorf("third arrival at %v (load 1) and %v (load 4), want 1s and 250ms", base.Flows[2].At, loaded.Flows[2].At)
	}
	if w.speedup != 2 || loaded.Params["load"] != 4.0 {
		t.Errorf("speedup %v, load param %v: --load must not change the workers' speed", w.speedup, loaded.Params["load"])
	}
	_, _, arr, err := buildDemoWorkload("--workload", "shared-prefix", "--arrival", "poisson", "--rate", "3", "--load", "2")
	if err != nil || arr.Rate != 6 {
		t.Errorf("poisson rate %v (err %v), want 3 × 2", arr.Rate, err)
	}
	for _, args := range [][]string{
		{"--load", "0"},
		{"--load", "-1"},
		{"--speedup", "0"},
		{"--workload", "shared-prefix", "--load", "2"}, // concurrency arrival
	} {
		if _, _, _, err := buildDemoWorkload(args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestDemoDefaultsToAgentSessionsNearTheKnee(t *testing.T) {
	w, wl, arr, err := buildDemoWorkload()
	if err != nil {
		t.Fatal(err)
	}
	if wl.Name != "agent" || w.load != demoLoad || arr.Kind != bench.ArrivalTrace {
		t.Fatalf("demo default: workload %s, load %g, arrival %s; want agent at load %d on trace arrival", wl.Name, w.load, arr.Kind, demoLoad)
	}
	if n := wl.Requests(); n == 0 || n > demoMaxRequests {
		t.Fatalf("%d requests, want whole sessions up to %d", n, demoMaxRequests)
	}
	if _, wl, _, err := buildDemoWorkload("--load", "2"); err != nil || wl.Params["load"] != 2.0 {
		t.Fatalf("an explicit --load is kept: %v, %v", wl.Params["load"], err)
	}
}

// replay reads the block size and the fleet's capacity from the workers it
// drives, unless the command line gives them, and defaults to kvsim's.
func TestReplayBlockSizeFromWorkers(t *testing.T) {
	wf := filepath.Join(t.TempDir(), "workers.yaml")
	if err := os.WriteFile(wf, []byte(`{"workers": [
		{"id": "w0", "model": "m", "address": "127.0.0.1:1", "block_size": 32, "kv_total_blocks": 100},
		{"id": "w1", "model": "m", "address": "127.0.0.1:2", "block_size": 32, "kv_total_blocks": 50}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args           []string
		block, capBlks int
	}{
		{nil, sim.DefaultBlockSize, 0},
		{[]string{"--workers-file", wf}, 32, 150},
		{[]string{"--workers-file", wf, "--block-size", "16", "--capacity-blocks", "7"}, 16, 7},
	} {
		var r replayFlags
		fs := newReplayFlags(&r, io.Discard)
		if err := parse(fs, tc.args, io.Discard); err != nil {
			t.Fatal(err)
		}
		if err := r.fromWorkers(fs, io.Discard); err != nil {
			t.Fatal(err)
		}
		if r.blockSize != tc.block || r.capacity != tc.capBlks {
			t.Errorf("%v: block size %d, capacity %d; want %d, %d", tc.args, r.blockSize, r.capacity, tc.block, tc.capBlks)
		}
	}
}

// The first screen describes the run that follows: both parts with the
// sweep, only the real-time part without it, and the real Envoy.
func TestDemoPlanDescribesTheRun(t *testing.T) {
	d := demoFlags{workers: 8, sweep: demoSweepLoads, sweepWL: "agent"}
	d.wl.load = demoLoad
	plan := d.plan("agent", 640, []string{"round_robin", "kv"}, "/tmp/out")
	for _, want := range []string{"part 1, virtual time: the agent workload at loads 1,2,4,8,16 for kv, round_robin, least_loaded on 8 simulated workers",
		"part 2, real time: the agent workload (640 requests, load 8)", "kvroute and a real Envoy", "round_robin, kv"} {
		if !strings.Contains(plan, want) {
			t.Errorf("plan lacks %q:\n%s", want, plan)
		}
	}
	d.sweep = ""
	if plan := d.plan("trace", 30, []string{"kv"}, "/tmp/out"); strings.Contains(plan, "virtual time") || !strings.Contains(plan, "part 1, real time: the trace workload") {
		t.Errorf("without a sweep:\n%s", plan)
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"demo", "--help"}, &out, io.Discard); code != 0 {
		t.Fatalf("demo --help: exit %d", code)
	}
	for _, want := range []string{"Part 1, in virtual time", "Part 2, in real time", "a real Envoy", "default " + strconv.Itoa(demoMaxRequests), demoSweepLoads} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo --help lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "first 500 requests") {
		t.Error("demo --help still describes the old default (the trace's first 500 requests)")
	}
}

// kvbench sim states the timing it ran under: the JSON setup always, the
// Markdown header when it is not the default polynomial, whose reports stay
// as they were.
func TestSimReportsStateTheTiming(t *testing.T) {
	dir := t.TempDir()
	times := map[string]string{}
	for _, tt := range []struct{ timing, label string }{
		{"polynomial", "Dynamo mocker polynomial"},
		{"h100-llama3-8b", "h100-llama3-8b"},
	} {
		path := filepath.Join(dir, tt.timing+".json")
		var out, errb bytes.Buffer
		args := []string{"sim", "--workload", "shared_prefix", "--sessions", "60", "--modes", "kv", "--load", "1", "--parallel", "1",
			"--timing", tt.timing, "--json", path}
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("exit %d\n%s", code, errb.String())
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			Setup struct {
				Timing  string          `json:"timing"`
				Profile json.RawMessage `json:"timing_profile"`
			} `json:"setup"`
			Sweep map[string][]struct {
				TTFT struct {
					P50 float64 `json:"p50"`
				} `json:"ttft_ms"`
			} `json:"sweep"`
		}
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Setup.Timing != tt.label {
			t.Errorf("--timing %s: setup.timing %q, want %q", tt.timing, rep.Setup.Timing, tt.label)
		}
		header := strings.SplitN(out.String(), "\n", 2)[0]
		if named := strings.Contains(header, "timing "); named != (tt.timing != "polynomial") {
			t.Errorf("--timing %s: Markdown header %q", tt.timing, header)
		}
		if hasProfile := len(rep.Setup.Profile) > 0; hasProfile != (tt.timing != "polynomial") {
			t.Errorf("--timing %s: timing_profile %s", tt.timing, rep.Setup.Profile)
		}
		times[tt.timing] = fmt.Sprint(rep.Sweep["kv"][0].TTFT.P50)
	}
	if times["polynomial"] == times["h100-llama3-8b"] {
		t.Errorf("both timings give TTFT p50 %s ms", times["polynomial"])
	}
}
