package sim

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func TestTimingPolynomial(t *testing.T) {
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"no prefill costs nothing", PrefillMillis(0), 0},
		{"prefill 1 token", PrefillMillis(1), 4.209989e-7 + 1.518344e-2 + 16.50142},
		{"prefill 8192 tokens", PrefillMillis(8192), 4.209989e-7*8192*8192 + 1.518344e-2*8192 + 16.50142},
		{"decode empty cache", DecodeMillis(0), 5.74},
		{"decode half full", DecodeMillis(0.5), -25.74*0.25 + 54.01*0.5 + 5.74},
		{"decode floor is 1 ms", DecodeMillis(3), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if math.Abs(tt.got-tt.want) > 1e-9 {
				t.Fatalf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
	m := NewTimingModel(nil, 10, 0, 1)
	res := &StepResult{Scheduled: 2, PrefillTokens: 1000, DecodeTokens: 1}
	if d, want := m.StepDuration(res, 100), (PrefillMillis(1000)+DecodeMillis(0.01))/10; math.Abs(d.Seconds()*1000-want) > 1e-3 {
		t.Fatalf("speedup 10: %v, want %vms", d, want)
	}
	// p is the decoding requests' KV after the step, whatever the
	// prefilling requests hold.
	mixed := &StepResult{Scheduled: 3, PrefillTokens: 8192, PrefillContext: 50000, DecodeTokens: 2, DecodeKVTokens: 9998}
	if got, want := StepMillis(mixed, 100000), PrefillMillis(8192)+DecodeMillis(0.1); math.Abs(got-want) > 1e-9 {
		t.Fatalf("mixed step %v ms, want %v", got, want)
	}
	// A step that only prefills pays no decode_ms, as in Dynamo's replay.
	prefillOnly := &StepResult{Scheduled: 1, PrefillTokens: 1000}
	if d, want := m.StepDuration(prefillOnly, 100), PrefillMillis(1000)/10; math.Abs(d.Seconds()*1000-want) > 1e-3 {
		t.Fatalf("prefill only, speedup 10: %v, want %vms", d, want)
	}
	j1, j2 := NewTimingModel(nil, 1, 0.2, 7), NewTimingModel(nil, 1, 0.2, 7)
	for range 10 {
		a, b := j1.StepDuration(res, 100), j2.StepDuration(res, 100)
		if a != b {
			t.Fatal("jitter with the same seed differs")
		}
		base := (PrefillMillis(1000) + DecodeMillis(0.01)) * 1e6
		if f := float64(a) / base; f < 0.8-1e-9 || f > 1.2+1e-9 {
			t.Fatalf("jitter factor %v outside [0.8, 1.2]", f)
		}
	}
}

func TestChunkedPrefillRespectsTheTokenBudget(t *testing.T) {
	e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 64, BlockSize: 4, MaxNumBatchedTokens: 32})
	if err := e.Add(1, seq(0, 100), 2); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(2, seq(1000, 10), 2); err != nil {
		t.Fatal(err)
	}
	var prefill, decode []int
	for e.HasWork() {
		res := e.Step()
		prefill = append(prefill, res.PrefillTokens)
		decode = append(decode, res.DecodeTokens)
	}
	// Request 2 waits for the budget request 1's chunks leave over.
	wantPrefill := []int{32, 32, 32, 4 + 10, 0}
	wantDecode := []int{0, 0, 0, 0, 2}
	if !slices.Equal(prefill, wantPrefill) || !slices.Equal(decode, wantDecode) {
		t.Fatalf("prefill per step %v decode %v, want %v / %v", prefill, decode, wantPrefill, wantDecode)
	}
}

func TestMaxNumSeqsBoundsTheRunningSet(t *testing.T) {
	e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 64, BlockSize: 4, MaxNumSeqs: 2})
	for id := uint64(1); id <= 3; id++ {
		if err := e.Add(id, seq(int(id)*100, 8), 5); err != nil {
			t.Fatal(err)
		}
	}
	e.Step()
	if st := e.Stats(); st.Running != 2 || st.Waiting != 1 {
		t.Fatalf("running %d waiting %d, want 2 and 1", st.Running, st.Waiting)
	}
	out := drain(t, e)
	for id := uint64(1); id <= 3; id++ {
		if len(out[id]) != 5 && !(id < 3 && len(out[id]) == 4) {
			t.Fatalf("request %d produced %d tokens", id, len(out[id]))
		}
	}
}

func TestPreemptionRecomputesTheNewestRequest(t *testing.T) {
	// 6 blocks of 4 tokens; two requests of 8 prompt tokens decode 12 tokens
	// each. At 13 tokens request 1 needs a fifth block: the newest request
	// (2) is preempted, waits for free blocks, then recomputes everything
	// but the one block of its prefix that survived eviction.
	e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 6, BlockSize: 4})
	if err := e.Add(1, seq(0, 8), 12); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(2, seq(100, 8), 12); err != nil {
		t.Fatal(err)
	}
	type step struct {
		prefill, decode, preempted int
		ids                        []uint64
		running, waiting           int
	}
	want := map[int]step{
		0:  {16, 0, 0, []uint64{1, 2}, 2, 0},
		4:  {0, 2, 0, []uint64{1, 2}, 2, 0},
		5:  {0, 1, 1, []uint64{1}, 1, 1},
		11: {0, 1, 0, []uint64{1}, 0, 1},
		12: {9, 0, 0, []uint64{2}, 1, 0},
		18: {0, 1, 0, []uint64{2}, 0, 0},
	}
	count := map[uint64]int{}
	i := 0
	for ; e.HasWork(); i++ {
		res := e.Step()
		var ids []uint64
		for _, o := range res.Outputs {
			if o.Index != count[o.ID] {
				t.Fatalf("step %d: request %d output index %d, want %d", i, o.ID, o.Index, count[o.ID])
			}
			count[o.ID]++
			ids = append(ids, o.ID)
		}
		st := e.Stats()
		got := step{res.PrefillTokens, res.DecodeTokens, res.Preempted, ids, st.Running, st.Waiting}
		if w, ok := want[i]; ok && !(w.prefill == got.prefill && w.decode == got.decode && w.preempted == got.preempted &&
			slices.Equal(w.ids, got.ids) && w.running == got.running && w.waiting == got.waiting) {
			t.Fatalf("step %d: %+v, want %+v", i, got, w)
		}
	}
	if i != 19 || count[1] != 12 || count[2] != 12 {
		t.Fatalf("%d steps, outputs %v; want 19 steps and 12 tokens each", i, count)
	}
	st := e.Stats()
	if st.Preemptions != 1 || st.UsedBlocks != 0 || st.PrefixHits != 4 {
		t.Fatalf("stats %+v: want 1 preemption, no used blocks, 4 tokens hit on resume", st)
	}
}

func TestOutputIsDeterministic(t *testing.T) {
	run := func() []int32 {
		e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 64, BlockSize: 4})
		if err := e.Add(9, seq(0, 30), 10); err != nil {
			t.Fatal(err)
		}
		var toks []int32
		for _, o := range drain(t, e)[9] {
			toks = append(toks, o.Token)
		}
		return toks
	}
	a, b := run(), run()
	if !slices.Equal(a, b) || len(a) != 10 {
		t.Fatalf("outputs differ or wrong length: %v vs %v", a, b)
	}
}

func TestAddRejectsBadRequests(t *testing.T) {
	e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 4, BlockSize: 4})
	if err := e.Add(1, seq(0, 4), 1); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		id     uint64
		prompt []int32
		max    int
	}{
		{"empty prompt", 2, nil, 1},
		{"zero max_tokens", 2, seq(0, 4), 0},
		{"larger than the cache", 2, seq(0, 16), 1},
		{"duplicate id", 1, seq(0, 4), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := e.Add(tt.id, tt.prompt, tt.max); !errors.Is(err, ErrRequest) {
				t.Fatalf("err = %v, want ErrRequest", err)
			}
		})
	}
}

// A lone prompt's time to first token under the polynomial equals what
// Dynamo's replay (ai-dynamo 1.6.1, run_trace_replay, one mocker worker of
// 5,632 blocks of 64 tokens, 8,192 batched tokens) reports for it: its
// chunks are prefill-only steps, which pay no decode_ms.
func TestPolynomialLonePromptMatchesDynamosReplay(t *testing.T) {
	for _, tc := range []struct {
		prompt int
		dynamo float64 // ms, per_request ttft_ms
	}{{512, 24.385704}, {8192, 169.136918}, {8193, 185.653522}, {16384, 338.273836}, {36640, 758.151149}} {
		e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 5632, BlockSize: 64, MaxNumBatchedTokens: 8192})
		if err := e.Add(1, seq(0, tc.prompt), 3); err != nil {
			t.Fatal(err)
		}
		ms := 0.0
		for i := 0; ; i++ {
			res := e.Step()
			ms += StepMillis(res, 5632*64)
			if len(res.Outputs) > 0 {
				break
			}
			if i > 100 {
				t.Fatalf("%d tokens: no first token after %d steps", tc.prompt, i)
			}
		}
		if math.Abs(ms-tc.dynamo) > 0.01 {
			t.Errorf("%d-token prompt: first token after %.3f ms, Dynamo's replay %.3f ms", tc.prompt, ms, tc.dynamo)
		}
	}
}
