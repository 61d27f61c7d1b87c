package sim

import (
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
			want := PrefillMillis(wantT) // the step only prefills: no decode_ms
			if math.Abs(got-want) > 1e-9 {
				t.Fatalf("step ms = %v, want %v", got, want)
			}
			if tt.wantCached > 0 && !(got < PrefillMillis(len(tt.second))) {
				t.Fatalf("cache hit did not shorten the step: %v", got)
			}
			st := e.Stats()
			if st.PrefixHits != uint64(tt.wantCached) {
				t.Fatalf("prefix hits = %d, want %d", st.PrefixHits, tt.wantCached)
			}
		})
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

func TestResyncReannouncesExactlyTheCache(t *testing.T) {
	e, rec := newTestEngine(t, EngineConfig{NumGPUBlocks: 8, BlockSize: 4})
	for i, p := range [][]int32{seq(0, 12), append(seq(0, 8), seq(50, 8)...), seq(100, 20)} {
		if err := e.Add(uint64(i), p, 1); err != nil {
			t.Fatal(err)
		}
		drain(t, e)
	}
	// Replay the events so far into a model of what a consumer holds.
	held := map[int64]bool{}
	apply := func(evs []Event) {
		for _, ev := range evs {
			switch ev.Kind {
			case BlockStored:
				for _, h := range ev.Hashes {
					held[h] = true
				}
			case BlockRemoved:
				for _, h := range ev.Hashes {
					delete(held, h)
				}
			case AllBlocksCleared:
				clear(held)
			}
		}
	}
	apply(rec.events)
	before := len(held)
	rec.events = nil
	e.Resync()
	if rec.events[0].Kind != AllBlocksCleared {
		t.Fatalf("first resync event %v", rec.events[0].Kind)
	}
	seen := map[int64]bool{}
	for _, ev := range rec.events[1:] {
		if ev.Kind != BlockStored || len(ev.Hashes) != 1 || len(ev.Tokens) != 4 {
			t.Fatalf("resync event %+v", ev)
		}
		if ev.HasParent {
			if _, cached := e.pool.lookup(ev.Parent); cached && !seen[ev.Parent] {
				t.Fatalf("block %d announced before its cached parent %d", ev.Hashes[0], ev.Parent)
			}
		}
		if want := blockHash(parentOr(ev), ev.Tokens); want != ev.Hashes[0] {
			t.Fatalf("resynced tokens do not hash to the block: %d vs %d", want, ev.Hashes[0])
		}
		seen[ev.Hashes[0]] = true
	}
	after := map[int64]bool{}
	for h := range held {
		after[h] = true
	}
	clear(held)
	apply(rec.events)
	if len(held) != before || len(held) != len(e.pool.cache) {
		t.Fatalf("after resync the consumer holds %d blocks, before %d, engine %d", len(held), before, len(e.pool.cache))
	}
	for h := range after {
		if !held[h] {
			t.Fatalf("block %d lost by resync", h)
		}
	}
}

func parentOr(ev Event) int64 {
	if ev.HasParent {
		return ev.Parent
	}
	return 0
}

// A request that decodes its last token in a step still holds its KV
// while that step runs, so the step's decode time counts it.
func TestFinishingStepCountsTheFinishingRequestsKV(t *testing.T) {
	e, _ := newTestEngine(t, EngineConfig{NumGPUBlocks: 64, BlockSize: 16})
	if err := e.Add(1, seq(0, 32), 2); err != nil {
		t.Fatal(err)
	}
	if res := e.Step(); len(res.Outputs) != 1 || res.Outputs[0].Finished || res.DecodeTokens != 0 {
		t.Fatalf("first step %+v, want the prompt's first token", res)
	}
	res := e.Step()
	if len(res.Outputs) != 1 || !res.Outputs[0].Finished {
		t.Fatalf("outputs %+v, want one finished", res.Outputs)
	}
	if res.DecodeTokens != 1 || res.DecodeKVTokens != 32 {
		t.Fatalf("decode tokens %d over %d KV tokens, want 1 over the finishing request's 32", res.DecodeTokens, res.DecodeKVTokens)
	}
	if e.HasWork() {
		t.Fatal("finished request still running")
	}
}
