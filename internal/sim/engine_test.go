package sim

import (
	"errors"
	"math"
	"slices"
	"testing"
)

// recorder keeps copies of the engine's events.
type recorder struct{ events []Event }

func (r *recorder) KVEvent(e Event) {
	e.Hashes = slices.Clone(e.Hashes)
	e.Tokens = slices.Clone(e.Tokens)
	r.events = append(r.events, e)
}

func (r *recorder) kinds() []EventKind {
	var k []EventKind
	for _, e := range r.events {
		k = append(k, e.Kind)
	}
	return k
}

func (r *recorder) removed() []int64 {
	var h []int64
	for _, e := range r.events {
		if e.Kind == BlockRemoved {
			h = append(h, e.Hashes...)
		}
	}
	return h
}

func seq(start, n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(start + i)
	}
	return s
}

func newTestEngine(t *testing.T, cfg EngineConfig) (*Engine, *recorder) {
	t.Helper()
	rec := &recorder{}
	e, err := NewEngine(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	return e, rec
}

// drain steps until the engine is idle and returns all outputs by id.
func drain(t *testing.T, e *Engine) map[uint64][]Output {
	t.Helper()
	out := map[uint64][]Output{}
	for i := 0; e.HasWork(); i++ {
		if i > 100000 {
			t.Fatal("engine did not finish")
		}
		for _, o := range e.Step().Outputs {
			out[o.ID] = append(out[o.ID], o)
		}
	}
	return out
}

func TestPrefixHitShortensPrefillByTheFormula(t *testing.T) {
	cfg := EngineConfig{NumGPUBlocks: 1024, BlockSize: 16}
	tests := []struct {
		name       string
		first      []int32
		second     []int32
		wantCached int
	}{
		{"shared 256-token prefix", seq(0, 256), append(seq(0, 256), seq(5000, 64)...), 256},
		{"identical prompt recomputes its last block", seq(0, 256), seq(0, 256), 240},
		{"prefix diverging mid-block uses whole blocks only", seq(0, 100), append(seq(0, 90), seq(7000, 30)...), 80},
		{"no shared prefix", seq(0, 128), seq(9000, 128), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := newTestEngine(t, cfg)
			if err := e.Add(1, tt.first, 1); err != nil {
				t.Fatal(err)
			}
			drain(t, e)
			if err := e.Add(2, tt.second, 1); err != nil {
				t.Fatal(err)
			}
			res := e.Step()
			wantT := len(tt.second) - tt.wantCached
			if res.PrefillTokens != wantT {
				t.Fatalf("prefill tokens = %d, want %d", res.PrefillTokens, wantT)
			}
			if len(res.Outputs) != 1 || res.Outputs[0].CachedTokens != tt.wantCached {
				t.Fatalf("outputs = %+v, want cached_tokens %d", res.Outputs, tt.wantCached)
			}
			if tt.wantCached%cfg.BlockSize != 0 {
				t.Fatalf("cached tokens %d not whole blocks", tt.wantCached)
			}
			got := StepMillis(res, 1024*16)
			want := PrefillMillis(wantT) + DecodeMillis(float64(res.ActiveKVTokens)/(1024*16))
			if math.Abs(got-want) > 1e-9 {
				t.Fatalf("step ms = %v, want %v", got, want)
			}
			if tt.wantCached > 0 && !(got < PrefillMillis(len(tt.second))+DecodeMillis(0)+1) {
				t.Fatalf("cache hit did not shorten the step: %v", got)
			}
			st := e.Stats()
			if st.PrefixHits != uint64(tt.wantCached) {
				t.Fatalf("prefix hits = %d, want %d", st.PrefixHits, tt.wantCached)
			}
		})
	}
}

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
	m := NewTimingModel(10, 0, 1)
	res := &StepResult{Scheduled: 1, PrefillTokens: 1000}
	if d, want := m.StepDuration(res, 100), (PrefillMillis(1000)+DecodeMillis(0))/10; math.Abs(d.Seconds()*1000-want) > 1e-3 {
		t.Fatalf("speedup 10: %v, want %vms", d, want)
	}
	j1, j2 := NewTimingModel(1, 0.2, 7), NewTimingModel(1, 0.2, 7)
	for range 10 {
		a, b := j1.StepDuration(res, 100), j2.StepDuration(res, 100)
		if a != b {
			t.Fatal("jitter with the same seed differs")
		}
		base := (PrefillMillis(1000) + DecodeMillis(0)) * 1e6
		if f := float64(a) / base; f < 0.8-1e-9 || f > 1.2+1e-9 {
			t.Fatalf("jitter factor %v outside [0.8, 1.2]", f)
		}
	}
}

func TestEvictionIsLRUAndTailFirst(t *testing.T) {
	// 8 blocks of 4 tokens. A (3 blocks) then B (3 blocks) finish; C needs
	// 5 fresh blocks: 2 never-used blocks, then A's blocks tail first, then...
	e, rec := newTestEngine(t, EngineConfig{NumGPUBlocks: 8, BlockSize: 4})
	if err := e.Add(1, seq(100, 12), 1); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	if err := e.Add(2, seq(200, 12), 1); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	var hashA, hashB []int64
	for _, ev := range rec.events {
		if ev.Kind == BlockStored && ev.Tokens[0] == 100 {
			hashA = ev.Hashes
		}
		if ev.Kind == BlockStored && ev.Tokens[0] == 200 {
			hashB = ev.Hashes
		}
	}
	if len(hashA) != 3 || len(hashB) != 3 {
		t.Fatalf("stored A=%v B=%v, want 3 blocks each", hashA, hashB)
	}
	rec.events = nil
	if err := e.Add(3, seq(300, 20), 1); err != nil {
		t.Fatal(err)
	}
	e.Step()
	// 8 blocks: 2 never used, then A's three (tail first), so one of A's is left.
	want := []int64{hashA[2], hashA[1], hashA[0]}
	if got := rec.removed(); !slices.Equal(got, want) {
		t.Fatalf("evicted %v, want A tail first %v", got, want)
	}
	// B is untouched and still a full prefix hit.
	drain(t, e)
	if err := e.Add(4, append(seq(200, 12), 1), 1); err != nil {
		t.Fatal(err)
	}
	if res := e.Step(); res.Outputs[0].CachedTokens != 12 {
		t.Fatalf("B's prefix: cached %d, want 12", res.Outputs[0].CachedTokens)
	}
}

func TestHitBlocksAreNotEvictedByTheirOwnAllocation(t *testing.T) {
	e, rec := newTestEngine(t, EngineConfig{NumGPUBlocks: 4, BlockSize: 4})
	if err := e.Add(1, seq(0, 8), 1); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	rec.events = nil
	// Reuses 2 cached free blocks and needs 2 more: exactly the pool.
	if err := e.Add(2, seq(0, 15), 1); err != nil {
		t.Fatal(err)
	}
	res := e.Step()
	if res.Outputs[0].CachedTokens != 8 {
		t.Fatalf("cached %d, want 8", res.Outputs[0].CachedTokens)
	}
	if got := rec.removed(); len(got) != 0 {
		t.Fatalf("evicted %v, want nothing", got)
	}
}

func TestBlocksAreCachedAsTheyFillIncludingDecode(t *testing.T) {
	e, rec := newTestEngine(t, EngineConfig{NumGPUBlocks: 16, BlockSize: 4})
	if err := e.Add(1, seq(10, 6), 7); err != nil {
		t.Fatal(err)
	}
	out := drain(t, e)[1]
	if len(out) != 7 || !out[6].Finished {
		t.Fatalf("outputs %+v, want 7 with the last finished", out)
	}
	// 6 prompt + 7 generated = 13 tokens, of which 12 (the last sampled token
	// has no KV) -> 3 full blocks, stored one event per fill.
	var stored []Event
	for _, ev := range rec.events {
		if ev.Kind == BlockStored {
			stored = append(stored, ev)
		}
	}
	if len(stored) != 3 {
		t.Fatalf("stored events %d, want 3: %+v", len(stored), stored)
	}
	if stored[0].HasParent || !slices.Equal(stored[0].Tokens, seq(10, 4)) {
		t.Fatalf("first stored block %+v", stored[0])
	}
	for i := 1; i < 3; i++ {
		if !stored[i].HasParent || stored[i].Parent != stored[i-1].Hashes[0] {
			t.Fatalf("block %d parent %d, want %d", i, stored[i].Parent, stored[i-1].Hashes[0])
		}
	}
	// The decode blocks hold the generated tokens.
	if stored[2].Tokens[3] != out[5].Token {
		t.Fatalf("decode block tokens %v, generated %v", stored[2].Tokens, out)
	}
	if stored[0].BlockSize != 4 {
		t.Fatalf("block size %d", stored[0].BlockSize)
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

func TestResetClearsTheCache(t *testing.T) {
	e, rec := newTestEngine(t, EngineConfig{NumGPUBlocks: 64, BlockSize: 4})
	if err := e.Add(1, seq(0, 16), 1); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	if err := e.Add(2, seq(500, 16), 50); err != nil {
		t.Fatal(err)
	}
	first := e.Step().Outputs
	e.Reset()
	if k := rec.kinds(); k[len(k)-1] != AllBlocksCleared {
		t.Fatalf("last event %v, want AllBlocksCleared", k[len(k)-1])
	}
	if st := e.Stats(); st.Running != 0 || st.Waiting != 1 || st.UsedBlocks != 0 {
		t.Fatalf("after reset %+v, want the running request back in waiting", st)
	}
	if err := e.Add(3, seq(0, 17), 1); err != nil {
		t.Fatal(err)
	}
	out := drain(t, e)
	if c := out[3][0].CachedTokens; c != 0 {
		t.Fatalf("cached %d after reset, want 0", c)
	}
	if len(first)+len(out[2]) != 50 {
		t.Fatalf("preempted request produced %d tokens, want 50", len(first)+len(out[2]))
	}
}

func TestAbortFreesBlocks(t *testing.T) {
	e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 64, BlockSize: 4})
	if err := e.Add(1, seq(0, 40), 100); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(2, seq(100, 40), 100); err != nil {
		t.Fatal(err)
	}
	e.Step()
	if !e.Abort(1) || e.Abort(1) {
		t.Fatal("abort should succeed once")
	}
	if !e.Abort(2) {
		t.Fatal("abort of a running request failed")
	}
	if st := e.Stats(); st.UsedBlocks != 0 || e.HasWork() {
		t.Fatalf("after aborts %+v", st)
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
