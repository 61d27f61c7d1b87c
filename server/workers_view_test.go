package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

func TestWorkerLineHealth(t *testing.T) {
	fresh := &scoring.Load{ReportFresh: true, Report: scoring.LoadReport{Running: 3, Waiting: 1}, PrefillRate: 12345.6, FitSamples: 4}
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
	l := workerView{Record: scoring.WorkerSpec{ID: "w0"}, Load: fresh, Index: &kvindex.WorkerStats{Blocks: 7}}.line()
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
