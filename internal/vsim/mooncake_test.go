package vsim

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/scoring"
)

// exported writes w as a Mooncake trace with sessions at blockSize and
// reads it back, as sessions and as a workload in format.
func exported(t *testing.T, w *Workload, blockSize int, format string) ([]bench.TraceSession, *Workload) {
	t.Helper()
	sessions, err := w.MooncakeSessions(smallFleet().Engine, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := bench.WriteSessionTrace(&buf, sessions); err != nil {
		t.Fatal(err)
	}
	back, err := bench.ReadSessionTrace(&buf, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	rw, err := SessionTraceWorkload("exported", back, blockSize, format)
	if err != nil {
		t.Fatal(err)
	}
	return back, rw
}

func TestExportedAgentKeepsItsShapeAndReuse(t *testing.T) {
	w := smallAgent(t)
	sessions, rw := exported(t, w, 64, FormatMooncake)
	if len(sessions) != len(w.Sessions) || rw.Requests() != w.Requests() {
		t.Fatalf("%d sessions, %d requests; want %d, %d", len(sessions), rw.Requests(), len(w.Sessions), w.Requests())
	}
	for s, sess := range sessions {
		// Whole milliseconds, relative to the first session.
		if want := w.Sessions[s].Start.Round(time.Millisecond) - w.Sessions[0].Start.Round(time.Millisecond); sess.Start != want {
			t.Fatalf("session %d starts at %v, want %v", s, sess.Start, want)
		}
		for k, turn := range sess.Turns[1:] {
			if turn.Delay != w.Sessions[s].Think {
				t.Fatalf("session %d turn %d: delay %v, want the think time %v", s, k+1, turn.Delay, w.Sessions[s].Think)
			}
			// A later turn's prompt extends the one before: its full
			// blocks come back with the same ids.
			prev := sess.Turns[k]
			full := prev.InputLength / 64
			for i := 0; i < full; i++ {
				if turn.HashIDs[i] != prev.HashIDs[i] {
					t.Fatalf("session %d turn %d: block %d id %d, want the previous turn's %d", s, k+1, i, turn.HashIDs[i], prev.HashIDs[i])
				}
			}
		}
	}
	// The replayed trace reuses what the workload does, less the blocks
	// that hold generated tokens (a replay cannot know them).
	ideal := func(w *Workload) float64 {
		id, _ := bench.IdealOf(func(yield func([]int32)) { w.Prompts(smallFleet().Engine, yield) }, 64, 1<<30)
		return id.Infinite
	}
	orig, back := ideal(w), ideal(rw)
	if back > orig || back < orig-0.03 {
		t.Errorf("ideal hit rate %.3f after export, %.3f before", back, orig)
	}
	r := run(t, rw, "kv", 1, nil)
	if r.HitRate < back-0.03 || r.SameWorker < 0.9 {
		t.Errorf("kv on the exported trace: hit rate %.3f (ideal %.3f), same worker %.2f", r.HitRate, back, r.SameWorker)
	}
}

func TestDeltaTurnsAppendToTheHistory(t *testing.T) {
	// Two turns: 4 blocks, then 2 more blocks after the output.
	sessions := []bench.TraceSession{{Turns: []bench.SessionTurn{
		{InputLength: 256, OutputLength: 10, HashIDs: []int64{1, 2, 3, 4}},
		{Delay: time.Second, InputLength: 100, OutputLength: 5, HashIDs: []int64{8, 9}},
	}}}
	cfg := sim.EngineConfig{BlockSize: 64}
	for _, tc := range []struct {
		format string
		want   int
	}{{FormatMooncake, 100}, {FormatMooncakeDelta, 256 + 10 + 100}} {
		w, err := SessionTraceWorkload("t", sessions, 64, tc.format)
		if err != nil {
			t.Fatal(err)
		}
		var lens []int
		w.Prompts(cfg, func(p []int32) { lens = append(lens, len(p)) })
		if len(lens) != 2 || lens[0] != 256 || lens[1] != tc.want {
			t.Errorf("%s: prompt lengths %v, want [256 %d]", tc.format, lens, tc.want)
		}
		// Served, the second turn waits its delay after the first ends.
		r := run(t, w, "round_robin", 2, nil)
		if r.SpanSeconds < 0.5 || math.IsNaN(r.SpanSeconds) {
			t.Errorf("%s: span %.3f s, want the 1 s delay halved at load 2 in it", tc.format, r.SpanSeconds)
		}
	}
	if _, err := SessionTraceWorkload("t", sessions, 64, "weka"); err == nil {
		t.Error("an unknown format accepted")
	}
}

// Replayed under the polynomial, small traces give the TTFTs Dynamo's own
// replay reports for them (ai-dynamo 1.6.1, run_trace_replay, offline,
// round robin over one mocker worker of 5,632 blocks of 64 tokens, 8,192
// batched tokens): requests that arrive together share the engine's first
// step, and a long prompt's passes beside a decoding request pay that
// request's decode_ms, not one inflated by the prompt's own KV.
func TestTracesMatchDynamosReplay(t *testing.T) {
	req := func(start time.Duration, input, output int, first int64) bench.TraceSession {
		ids := make([]int64, (input+511)/512)
		for i := range ids {
			ids[i] = first + int64(i)
		}
		return bench.TraceSession{Start: start, Turns: []bench.SessionTurn{{InputLength: input, OutputLength: output, HashIDs: ids}}}
	}
	for _, tc := range []struct {
		name     string
		sessions []bench.TraceSession
		dynamo   []float64 // each request's TTFT in ms, in arrival order
	}{
		{"three prompts at once", []bench.TraceSession{req(0, 2048, 100, 0), req(0, 2048, 100, 100), req(0, 2048, 100, 200)},
			[]float64{125.680652, 125.680652, 125.680652}},
		{"a long prompt beside a decode", []bench.TraceSession{req(0, 2048, 3000, 0), req(time.Second, 60000, 10, 100)},
			[]float64{49.362902, 1292.725161}},
	} {
		w, err := SessionTraceWorkload(tc.name, tc.sessions, 512, FormatMooncake)
		if err != nil {
			t.Fatal(err)
		}
		f := DefaultFleet()
		f.Workers = 1
		f.Engine.MaxNumBatchedTokens = 8192
		o := scoring.DefaultOptions()
		rep, err := Sweep(w, SweepOptions{Fleet: f, Router: o, Modes: []string{"round_robin"}, Loads: []float64{1},
			SLO: 2 * time.Second, Seed: 1, Requests: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Records) != len(tc.dynamo) {
			t.Fatalf("%s: %d records, want %d", tc.name, len(rep.Records), len(tc.dynamo))
		}
		for _, r := range rep.Records {
			if want := tc.dynamo[r.Request]; math.Abs(r.TTFTMs-want) > 0.01 {
				t.Errorf("%s: request %d: TTFT %.3f ms, Dynamo's replay %.3f ms", tc.name, r.Request, r.TTFTMs, want)
			}
		}
	}
}
