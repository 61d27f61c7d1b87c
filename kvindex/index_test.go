package kvindex

import (
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

const (
	testModel = "Qwen/Qwen3-8B"
	testBS    = 4
)

// doc is a token sequence of n full blocks of testBS tokens, block j of
// doc d made of tokens (d<<16 | j<<4 | k).
func doc(d, n int) []uint32 {
	toks := make([]uint32, 0, n*testBS)
	for j := 0; j < n; j++ {
		for k := 0; k < testBS; k++ {
			toks = append(toks, uint32(d<<16|j<<4|k))
		}
	}
	return toks
}

// engineOf is a fake engine hash for block j of doc d.
func engineOf(d, j int) vllmwire.EngineHash {
	return vllmwire.HashUint(uint64(d)<<32 | uint64(j) + 1000)
}

// storeEv stores blocks [from, to) of doc d, chained to block from-1.
func storeEv(d, from, to int) vllmwire.BlockStored {
	ev := vllmwire.BlockStored{TokenIDs: doc(d, to)[from*testBS:], BlockSize: testBS, Medium: ptr(vllmwire.MediumGPU)}
	for j := from; j < to; j++ {
		ev.BlockHashes = append(ev.BlockHashes, engineOf(d, j))
	}
	if from > 0 {
		ev.ParentBlockHash = ptr(engineOf(d, from-1))
	}
	return ev
}

func removeEv(d int, blocks ...int) vllmwire.BlockRemoved {
	ev := vllmwire.BlockRemoved{Medium: ptr(vllmwire.MediumGPU)}
	for _, j := range blocks {
		ev.BlockHashes = append(ev.BlockHashes, engineOf(d, j))
	}
	return ev
}

func withMedium[E vllmwire.BlockStored | vllmwire.BlockRemoved](ev E, m string) E {
	switch e := any(&ev).(type) {
	case *vllmwire.BlockStored:
		e.Medium = ptr(m)
	case *vllmwire.BlockRemoved:
		e.Medium = ptr(m)
	}
	return ev
}

func promptHashes(d, n int) []uint64 {
	return HashBlocks(Seed(testModel, "", ""), doc(d, n), testBS, nil)
}

type step struct {
	worker string
	events []vllmwire.Event
}

func TestApplySemantics(t *testing.T) {
	salted := storeEv(1, 0, 3)
	salted.ExtraKeys = mustRaw(t, []any{[]any{"tenant-a"}, nil, nil})
	lora := storeEv(1, 0, 3)
	lora.LoraName = ptr("sql-lora")
	lora.ExtraKeys = mustRaw(t, []any{[]any{"sql-lora", "tenant-b"}, []any{"sql-lora"}, []any{"sql-lora"}})
	otherGroup := storeEv(1, 0, 3)
	otherGroup.GroupIdx = ptr[int64](1)
	wrongSize := storeEv(1, 0, 3)
	wrongSize.BlockSize = 8
	wrongSize.TokenIDs = doc(1, 6)
	short := storeEv(1, 0, 3)
	short.TokenIDs = short.TokenIDs[:5]
	zeroParent := storeEv(1, 0, 3)
	zeroParent.ParentBlockHash = ptr(vllmwire.HashInt(0))
	bytesEv := storeEv(1, 0, 2)
	bytesEv.BlockHashes = []vllmwire.EngineHash{vllmwire.HashBytes([]byte("block-0")), vllmwire.HashBytes([]byte("block-1"))}

	tests := []struct {
		name      string
		steps     []step
		prompt    []uint64
		want      map[string]int // worker -> leading blocks
		cached    map[string]int
		stale     []string
		wantStats ApplyStats // of the last step
	}{
		{
			name:      "root chain is matched from the model seed",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 4)}}},
			prompt:    promptHashes(1, 6),
			want:      map[string]int{"w0": 4, "w1": 0},
			cached:    map[string]int{"w0": 4},
			wantStats: ApplyStats{StoredEvents: 1, StoredBlocks: 4},
		},
		{
			name:      "child chains from its parent's router hash",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 2)}}, {"w0", []vllmwire.Event{storeEv(1, 2, 5)}}},
			prompt:    promptHashes(1, 6),
			want:      map[string]int{"w0": 5},
			wantStats: ApplyStats{StoredEvents: 1, StoredBlocks: 3},
		},
		{
			name:      "unknown parent drops the event and marks the worker stale",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 2)}}, {"w0", []vllmwire.Event{storeEv(2, 3, 5), storeEv(1, 2, 3)}}},
			prompt:    promptHashes(1, 6),
			want:      map[string]int{"w0": 3},
			stale:     []string{"w0"},
			wantStats: ApplyStats{StoredEvents: 1, StoredBlocks: 1, UnknownParent: 1},
		},
		{
			name:      "an unknown parent of integer 0 is llm-d's root, not a gap",
			steps:     []step{{"w0", []vllmwire.Event{zeroParent}}},
			prompt:    promptHashes(1, 6),
			want:      map[string]int{"w0": 3},
			wantStats: ApplyStats{StoredEvents: 1, StoredBlocks: 3},
		},
		{
			name:      "removing a middle block cuts the prefix there",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 5)}}, {"w0", []vllmwire.Event{removeEv(1, 2)}}},
			prompt:    promptHashes(1, 5),
			want:      map[string]int{"w0": 2},
			cached:    map[string]int{"w0": 4},
			wantStats: ApplyStats{RemovedEvents: 1, RemovedBlocks: 1},
		},
		{
			name:      "unknown removes are counted and ignored",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 2)}}, {"w0", []vllmwire.Event{removeEv(7, 0, 1), removeEv(1, 1)}}},
			prompt:    promptHashes(1, 2),
			want:      map[string]int{"w0": 1},
			wantStats: ApplyStats{RemovedEvents: 2, RemovedBlocks: 1, UnknownRemoved: 2},
		},
		{
			name: "AllBlocksCleared purges the worker and clears stale",
			steps: []step{
				{"w0", []vllmwire.Event{storeEv(1, 0, 3), storeEv(2, 1, 2)}},
				{"w1", []vllmwire.Event{storeEv(1, 0, 3)}},
				{"w0", []vllmwire.Event{vllmwire.AllBlocksCleared{}}},
			},
			prompt:    promptHashes(1, 3),
			want:      map[string]int{"w0": 0, "w1": 3},
			cached:    map[string]int{"w0": 0, "w1": 3},
			wantStats: ApplyStats{Cleared: 1},
		},
		{
			name:      "a block size other than the worker's is rejected, and the stated size reported",
			steps:     []step{{"w0", []vllmwire.Event{wrongSize}}},
			prompt:    promptHashes(1, 3),
			want:      map[string]int{"w0": 0},
			wantStats: ApplyStats{BlockSizeMismatch: 1, EngineBlockSize: 8},
		},
		{
			name:      "token count not matching the blocks is malformed",
			steps:     []step{{"w0", []vllmwire.Event{short}}},
			prompt:    promptHashes(1, 3),
			want:      map[string]int{"w0": 0},
			wantStats: ApplyStats{Malformed: 1},
		},
		{
			name:      "CPU blocks are recorded but not matched",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 2), withMedium(storeEv(1, 2, 4), vllmwire.MediumCPU)}}},
			prompt:    promptHashes(1, 4),
			want:      map[string]int{"w0": 2},
			cached:    map[string]int{"w0": 2},
			wantStats: ApplyStats{StoredEvents: 2, StoredBlocks: 4, OffDeviceBlocks: 2},
		},
		{
			name: "an offloaded block stays a parent after leaving the GPU",
			steps: []step{
				{"w0", []vllmwire.Event{storeEv(1, 0, 2), withMedium(storeEv(1, 0, 2), vllmwire.MediumCPU), removeEv(1, 0, 1)}},
				{"w0", []vllmwire.Event{storeEv(1, 2, 3)}},
			},
			prompt:    promptHashes(1, 3),
			want:      map[string]int{"w0": 0},
			cached:    map[string]int{"w0": 1},
			wantStats: ApplyStats{StoredEvents: 1, StoredBlocks: 1},
		},
		{
			name:      "removing from CPU leaves the GPU copy",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 2), withMedium(storeEv(1, 0, 2), vllmwire.MediumCPU), withMedium(removeEv(1, 0, 1), vllmwire.MediumCPU)}}},
			prompt:    promptHashes(1, 2),
			want:      map[string]int{"w0": 2},
			wantStats: ApplyStats{StoredEvents: 2, StoredBlocks: 4, OffDeviceBlocks: 2, RemovedEvents: 1, RemovedBlocks: 2},
		},
		{
			name:      "cache_salt from the first block's extra keys seeds the chain",
			steps:     []step{{"w0", []vllmwire.Event{salted}}},
			prompt:    HashBlocks(Seed(testModel, "", "tenant-a"), doc(1, 3), testBS, nil),
			want:      map[string]int{"w0": 3},
			wantStats: ApplyStats{StoredEvents: 1, StoredBlocks: 3},
		},
		{
			name:   "a salted chain does not match the unsalted prompt",
			steps:  []step{{"w0", []vllmwire.Event{salted}}},
			prompt: promptHashes(1, 3),
			want:   map[string]int{"w0": 0},
			cached: map[string]int{"w0": 3},
		},
		{
			name:   "lora_name and the salt after it seed the chain",
			steps:  []step{{"w0", []vllmwire.Event{lora}}},
			prompt: HashBlocks(Seed(testModel, "sql-lora", "tenant-b"), doc(1, 3), testBS, nil),
			want:   map[string]int{"w0": 3},
		},
		{
			name:      "events of another KV cache group are ignored",
			steps:     []step{{"w0", []vllmwire.Event{otherGroup}}},
			prompt:    promptHashes(1, 3),
			want:      map[string]int{"w0": 0},
			wantStats: ApplyStats{IgnoredGroup: 1},
		},
		{
			name:      "a repeated store is a duplicate and one remove drops it",
			steps:     []step{{"w0", []vllmwire.Event{storeEv(1, 0, 2), storeEv(1, 0, 2), removeEv(1, 1)}}},
			prompt:    promptHashes(1, 2),
			want:      map[string]int{"w0": 1},
			wantStats: ApplyStats{StoredEvents: 2, StoredBlocks: 2, DuplicateBlocks: 2, RemovedEvents: 1, RemovedBlocks: 1},
		},
		{
			name: "two engine hashes for one router hash need two removes",
			steps: []step{{"w0", []vllmwire.Event{
				storeEv(1, 0, 2),
				vllmwire.BlockStored{BlockHashes: []vllmwire.EngineHash{vllmwire.HashUint(77)}, TokenIDs: doc(1, 1), BlockSize: testBS},
				removeEv(1, 0),
			}}},
			prompt: promptHashes(1, 2),
			want:   map[string]int{"w0": 2},
		},
		{
			name:   "byte-string engine hashes resolve like integers",
			steps:  []step{{"w0", []vllmwire.Event{bytesEv, vllmwire.BlockRemoved{BlockHashes: []vllmwire.EngineHash{vllmwire.HashBytes([]byte("block-1"))}}}}},
			prompt: promptHashes(1, 2),
			want:   map[string]int{"w0": 1},
		},
		{
			name:      "events for an unregistered worker change nothing",
			steps:     []step{{"ghost", []vllmwire.Event{storeEv(1, 0, 2)}}},
			prompt:    promptHashes(1, 2),
			want:      map[string]int{"w0": 0, "ghost": 0},
			wantStats: ApplyStats{UnknownWorker: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := New(Config{})
			ix.AddWorker("w0", testModel, testBS)
			ix.AddWorker("w1", testModel, testBS)
			var st ApplyStats
			for _, s := range tt.steps {
				st = ix.Apply(s.worker, vllmwire.EventBatch{Events: s.events})
			}
			if tt.wantStats != (ApplyStats{}) && st != tt.wantStats {
				t.Errorf("stats of the last batch = %+v\nwant %+v", st, tt.wantStats)
			}
			var cands []string
			for w := range tt.want {
				cands = append(cands, w)
			}
			res := ix.Match(tt.prompt, cands, nil)
			if len(res) != len(cands) {
				t.Fatalf("got %d results for %d candidates", len(res), len(cands))
			}
			for i, r := range res {
				w := cands[i]
				if int(r.Blocks) != tt.want[w] {
					t.Errorf("%s matched %d blocks, want %d", w, r.Blocks, tt.want[w])
				}
				if c, ok := tt.cached[w]; ok && int(r.Cached) != c {
					t.Errorf("%s caches %d blocks, want %d", w, r.Cached, c)
				}
				if r.Known != (w != "ghost") {
					t.Errorf("%s known = %v", w, r.Known)
				}
			}
			for _, w := range []string{"w0", "w1"} {
				want := false
				for _, s := range tt.stale {
					want = want || s == w
				}
				if got := ix.NeedsResync(w); got != want {
					t.Errorf("NeedsResync(%s) = %v, want %v", w, got, want)
				}
			}
		})
	}
}

func TestMatchReusesTheCallersSlice(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("a", testModel, testBS)
	ix.Apply("a", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3)}})
	out := make([]MatchResult, 0, 8)
	prompt := promptHashes(1, 3)
	cands := []string{"a"}
	allocs := testing.AllocsPerRun(100, func() { out = ix.Match(prompt, cands, out) })
	if allocs != 0 {
		t.Errorf("Match allocated %.1f times per call", allocs)
	}
	if out[0].Blocks != 3 {
		t.Errorf("matched %d, want 3", out[0].Blocks)
	}
}

func TestRemoveWorkerFreesItsBlocksAndIndex(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("a", testModel, testBS)
	ix.AddWorker("b", testModel, testBS)
	ix.Apply("a", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3)}})
	ix.Apply("b", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2)}})
	ix.RemoveWorker("a")
	if s := ix.Stats(); s.Workers != 1 || s.Entries != 2 || s.Blocks != 2 {
		t.Fatalf("stats after remove = %+v", s)
	}
	// A new worker reuses the dense slot and starts empty.
	ix.AddWorker("c", testModel, testBS)
	res := ix.Match(promptHashes(1, 3), []string{"a", "b", "c"}, nil)
	if res[0].Known || res[1].Blocks != 2 || res[2].Blocks != 0 || !res[2].Known {
		t.Fatalf("results = %+v", res)
	}
}

func TestAddWorkerWithNewBlockSizePurges(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("a", testModel, testBS)
	ix.Apply("a", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3)}})
	ix.AddWorker("a", testModel, testBS) // same: keeps
	if got := ix.Match(promptHashes(1, 3), []string{"a"}, nil)[0].Blocks; got != 3 {
		t.Fatalf("re-adding the same worker dropped blocks: %d", got)
	}
	ix.AddWorker("a", testModel, 16)
	if got := ix.Match(promptHashes(1, 3), []string{"a"}, nil)[0]; got.Blocks != 0 || got.Cached != 0 {
		t.Fatalf("changing block size kept blocks: %+v", got)
	}
}

func TestManyWorkersSpanSeveralWords(t *testing.T) {
	ix := New(Config{})
	var names []string
	for i := 0; i < 150; i++ {
		n := "w" + string(rune('A'+i/26)) + string(rune('a'+i%26))
		names = append(names, n)
		ix.AddWorker(n, testModel, testBS)
		ix.Apply(n, vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 1+i%7)}})
	}
	res := ix.Match(promptHashes(1, 8), names, nil)
	for i, r := range res {
		if int(r.Blocks) != 1+i%7 {
			t.Fatalf("%s matched %d, want %d", names[i], r.Blocks, 1+i%7)
		}
	}
}

func TestMatchCountsOffloadedTiersAfterTheDevicePrefix(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("w0", testModel, testBS)
	ix.AddWorker("w1", testModel, testBS)
	apply := func(evs ...vllmwire.Event) {
		t.Helper()
		ix.Apply("w0", vllmwire.EventBatch{Events: evs})
	}
	apply(storeEv(1, 0, 2), withMedium(storeEv(1, 2, 4), vllmwire.MediumCPU), withMedium(storeEv(1, 4, 5), "DISK"))
	prompt := promptHashes(1, 6)
	check := func(what string, blocks, host, disk int) {
		t.Helper()
		got := ix.Match(prompt, []string{"w0", "w1"}, nil)
		if int(got[0].Blocks) != blocks || int(got[0].HostBlocks) != host || int(got[0].DiskBlocks) != disk {
			t.Fatalf("%s: w0 device %d host %d disk %d, want %d %d %d", what, got[0].Blocks, got[0].HostBlocks, got[0].DiskBlocks, blocks, host, disk)
		}
		if got[1].HostBlocks != 0 || got[1].DiskBlocks != 0 {
			t.Fatalf("%s: w1 holds nothing offloaded, got %+v", what, got[1])
		}
	}
	check("device, host, disk in order", 2, 2, 1)
	apply(withMedium(removeEv(1, 3), vllmwire.MediumCPU))
	check("a host block leaves: the host run stops before it", 2, 1, 0)
	apply(withMedium(storeEv(1, 3, 4), "DISK"))
	check("the gap is filled on disk", 2, 1, 2)
	apply(withMedium(removeEv(1, 2, 3, 4), vllmwire.MediumCPU), withMedium(removeEv(1, 3, 4), "DISK"))
	check("everything offloaded is gone", 2, 0, 0)
	if n := len(ix.workers["w0"].offRouter); n != 0 {
		t.Fatalf("off-device counts leak: %d router hashes left", n)
	}
}

// Match remembers how the last candidate list resolved; a pool change or a
// caller reusing its slice for other names must not see a stale answer.
func TestMatchSeesPoolChangesThroughTheSameCandidateSlice(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("a", testModel, testBS)
	ix.Apply("a", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3)}})
	prompt := promptHashes(1, 3)
	cands := []string{"a", "b"}
	var out []MatchResult
	out = ix.Match(prompt, cands, out)
	if !out[0].Known || out[0].Blocks != 3 || out[1].Known {
		t.Fatalf("first match = %+v", out)
	}
	// b joins: the same slice must now resolve it.
	ix.AddWorker("b", testModel, testBS)
	ix.Apply("b", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2)}})
	out = ix.Match(prompt, cands, out)
	if !out[1].Known || out[1].Blocks != 2 {
		t.Fatalf("after b joined = %+v", out)
	}
	// a leaves and comes back empty under the same name.
	ix.RemoveWorker("a")
	ix.AddWorker("a", testModel, testBS)
	out = ix.Match(prompt, cands, out)
	if !out[0].Known || out[0].Blocks != 0 || out[1].Blocks != 2 {
		t.Fatalf("after a rejoined = %+v", out)
	}
	// The caller writes other names into the same backing array.
	cands[0], cands[1] = "b", "nobody"
	out = ix.Match(prompt, cands, out)
	if !out[0].Known || out[0].Blocks != 2 || out[1].Known {
		t.Fatalf("after the names changed = %+v", out)
	}
	// Stale and Cached follow the worker's state, not the cached list's.
	ix.MarkStale("b")
	out = ix.Match(prompt, cands, out)
	if !out[0].Stale || out[0].Cached != 2 {
		t.Fatalf("after b went stale = %+v", out)
	}
	// Results the caller changed are overwritten; events that change a
	// worker's counts show in the next answer for the same list.
	out[0].Blocks, out[0].HostBlocks, out[1].Known = 99, 5, true
	ix.Apply("b", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}, storeEv(1, 0, 3), storeEv(2, 0, 4)}})
	out = ix.Match(prompt, cands, out)
	if out[0].Stale || out[0].Cached != 7 || out[0].Blocks != 3 || out[0].HostBlocks != 0 || out[1].Known {
		t.Fatalf("after b cleared and stored = %+v", out)
	}
	// A worker named twice gets its answer twice.
	twice := []string{"b", "a", "b"}
	out = ix.Match(prompt, twice, out)
	if out[0] != out[2] || out[0].Blocks != 3 || out[1].Blocks != 0 || !out[1].Known {
		t.Fatalf("a worker named twice = %+v", out)
	}
}

// TestReserveSizesTheWorkersTable checks Reserve on the index: the
// worker's table is sized for the capacity, keeps its blocks, keeps the
// size when the engine clears its cache, and ignores nonsense.
func TestReserveSizesTheWorkersTable(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("w", testModel, testBS)
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 4)}})
	segs := func() int { return len(ix.workers["w"].device.counts) }
	ix.Reserve("w", 3000)
	if segs() != 8 {
		t.Fatalf("Reserve(3000): %d segments, want 8", segs())
	}
	prompt := HashBlocks(Seed(testModel, "", ""), doc(1, 4), testBS, nil)
	if got := ix.Match(prompt, []string{"w"}, nil); got[0].Blocks != 4 {
		t.Fatalf("after Reserve the worker matches %d blocks, want 4", got[0].Blocks)
	}
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}}})
	if segs() != 8 {
		t.Fatalf("after a clear: %d segments, want the 8 reserved", segs())
	}
	ix.Reserve("w", 0)
	ix.Reserve("w", -5)
	ix.Reserve("nobody", 3000)
	if segs() != 8 || ix.workers["w"].capacity != 3000 {
		t.Fatalf("Reserve(0), Reserve(-5) changed the table: %d segments, capacity %d", segs(), ix.workers["w"].capacity)
	}
	ix.Reserve("w", 1<<40)
	if c := ix.workers["w"].capacity; c != MaxReserveBlocks {
		t.Fatalf("Reserve(2^40): capacity %d, want MaxReserveBlocks", c)
	}
}
