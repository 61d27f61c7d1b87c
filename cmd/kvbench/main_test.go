package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
)

func TestHelpAndUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"--help"}, 0, "kvbench demo"},
		{[]string{}, 2, "Usage"},
		{[]string{"bogus"}, 2, "unknown command"},
		{[]string{"demo", "-help"}, 0, "--max-requests"},
		{[]string{"demo", "-help"}, 0, "-load float"},
		{[]string{"replay", "-help"}, 0, "-load float"},
		{[]string{"demo", "--load", "0"}, 1, "--load 0 must be positive"},
		{[]string{"demo", "--modes", "fastest"}, 1, "unknown router mode"},
		{[]string{"demo", "--workload", "chat"}, 1, "needs --tokenizer"},
		{[]string{"replay", "--arrival", "trace", "--workload", "shared-prefix"}, 1, "needs --workload trace"},
		{[]string{"gateway"}, 2, "unknown command"},
		{[]string{"demo", "extra"}, 2, "unexpected argument"},
		{[]string{"sim", "-help"}, 0, "h100-llama3-8b"},
		{[]string{"demo", "-help"}, 0, "-timing"},
		{[]string{"up", "-help"}, 0, "-timing"},
		{[]string{"sim", "--timing", "a100-nothing"}, 2, "neither a known name (polynomial, h100-llama3-8b) nor a profile file"},
		{[]string{"demo", "--timing", "main_test.go"}, 2, "main_test.go: timing profile: invalid character"},
		{[]string{"sim", "-help"}, 0, "-explain-requests"},
		{[]string{"sim", "--explain-requests", "3"}, 1, "--explain-requests and --explain-out go together"},
		{[]string{"sim", "--explain-requests", "-1", "--explain-out", "x"}, 1, "each value must be a request index"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		all := out.String() + errb.String()
		if code != tc.code || !strings.Contains(all, tc.contains) {
			t.Errorf("kvbench %v: exit %d, output %q; want exit %d containing %q", tc.args, code, all, tc.code, tc.contains)
		}
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	t.Setenv("KVROUTE_MODES", "fastest")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"demo"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "fastest") {
		t.Errorf("KVROUTE_MODES ignored: exit %d, %s", code, errb.String())
	}
}

// A short demo runs the whole embedded system and writes the three reports.
func TestDemoWritesReportsForEveryMode(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"demo", "--workload", "trace", "--workers", "4", "--load", "1", "--max-requests", "30", "--speedup", "40",
		"--modes", "round_robin,kv", "--sweep-loads", "", "--out-dir", dir, "--timing", "h100-llama3-8b"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	f, err := os.Open(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := bench.ReadReport(f)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rep.Order, ",") != "round_robin,kv" {
		t.Fatalf("modes %v", rep.Order)
	}
	if rep.Setup["timing"] != "h100-llama3-8b" || !strings.Contains(rep.SetupLine(), "timing h100-llama3-8b") {
		t.Errorf("report setup %v does not state the timing", rep.Setup)
	}
	for _, m := range rep.Order {
		if r := rep.Modes[m]; r.Requests != 30 || r.Errors != 0 || len(r.WorkerShare) == 0 {
			t.Errorf("%s: %d requests, %d errors (%s), shares %v", m, r.Requests, r.Errors, r.FirstError, r.WorkerShare)
		}
	}
	// kv predicts every request's cached tokens (the header travels from
	// kvroute through the gateway to kvsim and back); round robin predicts
	// nothing.
	if kv, rr := rep.Modes["kv"], rep.Modes["round_robin"]; kv.Predicted != 30 || kv.OverlapExact == nil || rr.Predicted != 0 || rr.OverlapExact != nil {
		t.Errorf("predictions: kv %d (exact %v), round_robin %d (exact %v); want 30 and 0", kv.Predicted, kv.OverlapExact, rr.Predicted, rr.OverlapExact)
	}
	// The trace's first 30 requests start 30 conversations: no follow-ups.
	for _, m := range rep.Order {
		if r := rep.Modes[m]; r.FollowUps != 0 || r.Stickiness != nil {
			t.Errorf("%s: %d follow-ups, stickiness %v; want none", m, r.FollowUps, r.Stickiness)
		}
	}
	for _, name := range []string{"report.md", "chart.svg"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(out.String(), "| round_robin | 30 | 0 |") || !strings.Contains(out.String(), "report: ") {
		t.Errorf("table or report path missing from the output:\n%s", out.String())
	}
}

// Replay drives a running server (here one kvsim worker) and reports it.
func TestReplayAgainstARunningWorker(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := sim.StartWorker(ctx, sim.WorkerConfig{ID: "solo", Model: bench.DefaultModel, Speedup: 100,
		Engine: sim.EngineConfig{NumGPUBlocks: 2048, BlockSize: 16}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"replay", "--url", w.URL(), "--workload", "shared-prefix", "--groups", "2", "--per-group", "4",
		"--system-tokens", "256", "--question-tokens", "32", "--output-tokens", "4", "--concurrency", "2",
		"--label", "direct", "--out-dir", dir, "--capacity-blocks", "2048"}
	if code := run(ctx, args, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	f, err := os.Open(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := bench.ReadReport(f)
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Modes["direct"]
	if m == nil || m.Requests != 8 || m.Errors != 0 || m.WorkerShare["solo"] != 1 || m.HitRate <= 0 {
		t.Fatalf("report %+v", m)
	}
	// Every question after a group's first follows it, on the one worker.
	if m.FollowUps != 6 || m.Stickiness == nil || *m.Stickiness != 1 {
		t.Errorf("%d follow-ups, stickiness %v; want 6 and 1", m.FollowUps, m.Stickiness)
	}
	if m.Predicted != 0 || m.OverlapExact != nil {
		t.Errorf("no router, yet %d predictions (overlap exact %v)", m.Predicted, m.OverlapExact)
	}
	// One worker holds everything, so it reaches the infinite-cache bound.
	if *rep.IdealHitRate-m.HitRate > 0.01 {
		t.Errorf("hit rate %.3f, reference %.3f", m.HitRate, *rep.IdealHitRate)
	}
}

// kvbench up brings the stack up, prints a curl line that works, and stops
// when interrupted.
func TestUpPrintsAWorkingCurlLine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &testenv.SyncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"up", "--workers", "2", "--speedup", "50", "--tokenizer", "../../" + upTokenizer}, out, io.Discard)
	}()
	var m []string
	curl := regexp.MustCompile(`curl -si (http://\S+)/v1/chat/completions -H 'content-type: application/json' -d '([^']*)'`)
	deadline := time.Now().Add(60 * time.Second)
	for m == nil && time.Now().Before(deadline) {
		m = curl.FindStringSubmatch(out.String())
		time.Sleep(50 * time.Millisecond)
	}
	if m == nil {
		t.Fatalf("no curl line:\n%s", out.String())
	}
	admin := regexp.MustCompile(`curl -s (http://\S+)/debug/requests`).FindStringSubmatch(out.String())
	if admin == nil {
		t.Fatalf("no /debug/requests line:\n%s", out.String())
	}
	// The printed request, run twice as the output says: the second is
	// served from the cache of the worker that served the first.
	type answer struct {
		worker string
		cached int
	}
	send := func() answer {
		resp, err := http.Post(m[1]+"/v1/chat/completions", "application/json", strings.NewReader(m[2]))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v struct {
			Object string `json:"object"`
			Usage  struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &v); resp.StatusCode != 200 || err != nil || v.Object != "chat.completion" {
			t.Fatalf("the printed request answered %d (%v): %s", resp.StatusCode, err, body)
		}
		return answer{resp.Header.Get("x-kvroute-worker"), v.Usage.Details.Cached}
	}
	first := send()
	if first.worker == "" {
		t.Error("no x-kvroute-worker header on the answer")
	}
	// The worker's KV events reach the router within milliseconds; the
	// second run waits for the first's blocks to be known.
	var second answer
	waitUntil(t, "the second run to be a cache hit", func() bool {
		second = send()
		return second.cached > 0
	})
	if second.worker != first.worker {
		t.Errorf("second run on %q, first on %q: want the same worker", second.worker, first.worker)
	}
	resp, err := http.Get(admin[1] + "/debug/requests?limit=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"worker": "`+first.worker+`"`) {
		t.Errorf("/debug/requests does not show the last decision on %s: %s", first.worker, body)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d:\n%s", code, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("kvbench up did not stop")
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
