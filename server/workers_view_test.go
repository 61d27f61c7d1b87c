package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

func TestWorkerLineHealth(t *testing.T) {
	fresh := &scoring.Load{ReportFresh: true, Report: fleet.LoadReport{Running: 3, Waiting: 1}, PrefillRate: 12345.6, FitSamples: 4}
	for _, tc := range []struct {
		name   string
		view   workerView
		health string
	}{
		{"reporting", workerView{Load: fresh, Index: &kvindex.WorkerStats{Blocks: 7}}, "ok"},
		{"no load yet", workerView{}, "no_report"},
		{"report not fresh", workerView{Load: &scoring.Load{}}, "no_report"},
		{"silent", workerView{Load: &scoring.Load{ReportSilent: true}}, "silent"},
		{"stale index", workerView{Load: fresh, Index: &kvindex.WorkerStats{Stale: true}}, "stale"},
		{"ejected beats stale", workerView{Load: &scoring.Load{Ejected: true, ReportFresh: true}, Index: &kvindex.WorkerStats{Stale: true}}, "ejected"},
	} {
		if got := tc.view.line().Health; got != tc.health {
			t.Errorf("%s: health %q, want %q", tc.name, got, tc.health)
		}
	}
	l := workerView{Record: fleet.Worker{ID: "w0"}, Load: fresh, Index: &kvindex.WorkerStats{Blocks: 7}}.line()
	if want := (workerLine{ID: "w0", Health: "ok", Running: 3, Waiting: 1, CachedBlocks: 7, PrefillRate: 12300}); l != want {
		t.Errorf("line = %+v, want %+v", l, want)
	}
	if l := (workerView{Load: &scoring.Load{PrefillRate: 500}}).line(); l.PrefillRate != 0 {
		t.Errorf("an unfitted rate shows as %v, want 0", l.PrefillRate)
	}
}

func TestCompactWorkersIsOneLineEachAndValidJSON(t *testing.T) {
	for _, n := range []int{0, 1, 3} {
		lines := make([]workerLine, n)
		for i := range lines {
			lines[i] = workerLine{ID: "w" + string(rune('0'+i)), Health: "ok"}
		}
		out := compactWorkers(map[string]any{"mode": "kv", "ready": true}, lines)
		var v struct {
			Mode    string       `json:"mode"`
			Workers []workerLine `json:"workers"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%d workers: %v\n%s", n, err, out)
		}
		if v.Mode != "kv" || len(v.Workers) != n {
			t.Errorf("%d workers: decoded %+v", n, v)
		}
		want := 1 // the head, with the closing brackets when empty
		if n > 0 {
			want = n + 2
		}
		if got := strings.Count(string(out), "\n"); got != want {
			t.Errorf("%d workers on %d lines, want %d:\n%s", n, got, want, out)
		}
	}
}

func TestRoundSig(t *testing.T) {
	for _, tc := range []struct{ x, want float64 }{{12345.6, 12300}, {0.012345, 0.0123}, {999.9, 1000}, {0, 0}} {
		if got := roundSig(tc.x, 3); got != tc.want {
			t.Errorf("roundSig(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
}

// A request that ended after the last load report no longer counts as
// running, though the report still says so until the next one.
func TestWorkerLineRunningLeavesOutRequestsEndedSinceTheReport(t *testing.T) {
	pool := scoring.NewPool(scoring.DefaultOptions())
	if err := pool.Upsert(fleet.Worker{ID: "w0", Model: "m", Address: "10.0.0.1:8000", BlockSize: 16, KVTotalBlocks: 100}); err != nil {
		t.Fatal(err)
	}
	req := &scoring.Request{ID: "r1", Model: "m", PromptTokens: 32}
	if err := pool.Add(req, "w0", 0); err != nil {
		t.Fatal(err)
	}
	if err := pool.SetLoadReport("w0", fleet.LoadReport{Running: 1}); err != nil {
		t.Fatal(err)
	}
	line := func() workerLine {
		l, ok := pool.Load("w0")
		if !ok {
			t.Fatal("w0 gone")
		}
		return workerView{Load: &l}.line()
	}
	if got := line().Running; got != 1 {
		t.Fatalf("running %d while the request runs, want 1", got)
	}
	pool.Free("r1")
	if got := line().Running; got != 0 {
		t.Errorf("running %d right after the request ended, want 0", got)
	}
	// The next report counts from itself again.
	if err := pool.SetLoadReport("w0", fleet.LoadReport{Running: 2}); err != nil {
		t.Fatal(err)
	}
	if got := line().Running; got != 2 {
		t.Errorf("running %d after a new report of 2, want 2", got)
	}
}
