package kvindex

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// walkMatch is Match as it was before walkJump: every worker walked block
// by block, whatever its links say.
func walkMatch(ix *Index, hashes []uint64) []MatchResult {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []MatchResult
	walked := make([]uint64, (len(ix.slots)+63)/64)
	for _, w := range ix.slots {
		if w == nil {
			continue
		}
		out = append(out, MatchResult{Worker: w.id, Known: true, Stale: w.stale, Cached: w.blocks})
		walked[w.idx>>6] |= 1 << (w.idx & 63)
	}
	depth := matchChains(ix.tab, len(ix.slots), hashes, walked, nil, &matchBufs{})
	i := 0
	for _, w := range ix.slots {
		if w == nil {
			continue
		}
		out[i].Blocks = int(depth[w.idx])
		if len(w.offRouter) > 0 {
			out[i].HostBlocks, out[i].DiskBlocks = w.offTiers(hashes[out[i].Blocks:])
		}
		i++
	}
	return out
}

// checkLinks recounts every worker's links from its link table and the
// block table.
func checkLinks(t *testing.T, ix *Index) {
	t.Helper()
	for _, w := range ix.slots {
		if w == nil || w.links.unknown {
			continue
		}
		slots := map[uint64]linkSlot{}
		for _, s := range w.links.t.slots {
			if s.key != 0 {
				slots[s.key] = s
			}
		}
		if len(slots) != w.links.t.count {
			t.Fatalf("%s: link table counts %d keys, holds %d", w.id, w.links.t.count, len(slots))
		}
		held, orphans := 0, 0
		kids := map[uint64]uint32{}
		for r, s := range slots {
			if s.held != ix.tab.has(r, w.idx) {
				t.Fatalf("%s: %x held %v in links, %v in the block table", w.id, r, s.held, !s.held)
			}
			if !s.held {
				if s.kids == 0 {
					t.Fatalf("%s: %x kept with neither holding nor children", w.id, r)
				}
				continue
			}
			held++
			if s.parent != 0 {
				kids[s.parent]++
				if !slots[s.parent].held {
					orphans++
				}
			}
		}
		if held != w.blocks {
			t.Fatalf("%s: %d held in links, %d blocks", w.id, held, w.blocks)
		}
		if orphans != w.links.orphans {
			t.Fatalf("%s: %d orphans, links say %d", w.id, orphans, w.links.orphans)
		}
		for r, s := range slots {
			if s.kids != kids[r] {
				t.Fatalf("%s: %d kids of %x, want %d", w.id, s.kids, r, kids[r])
			}
		}
	}
}

func TestJumpMatchAgreesWithWalkOnRandomStreams(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			const docs, docBlocks, nWorkers = 10, 90, 70 // two words of workers, several windows
			tokens := make([][]uint32, docs)
			for d := range tokens {
				tokens[d] = doc(d, docBlocks)
				copy(tokens[d], tokens[0][:(d%4)*20*testBS]) // shared prefixes
			}
			seed0 := Seed(testModel, "", "")
			routers := make([][]uint64, docs)
			for d := range routers {
				routers[d] = HashBlocks(seed0, tokens[d], testBS, nil)
			}
			engine := func(d, j int) vllmwire.EngineHash { return vllmwire.HashUint(routers[d][j] ^ 0x5eed) }
			ix := New(Config{JumpSearch: true})
			var workers []string
			for i := range nWorkers {
				workers = append(workers, fmt.Sprint("w", i))
				ix.AddWorker(workers[i], testModel, testBS)
			}
			// held[w][d] is how many leading blocks of doc d worker w stored,
			// so that most removals take a tail, as engines evict.
			held := make([][]int, nWorkers)
			for i := range held {
				held[i] = make([]int, docs)
			}
			closedSeen, openSeen, compared := 0, 0, 0
			for step := 0; step < 3000; step++ {
				wi := rng.IntN(nWorkers)
				w := workers[wi]
				d := rng.IntN(docs)
				var ev vllmwire.Event
				switch p := rng.IntN(100); {
				case p < 50: // extend a chain
					from := held[wi][d]
					if from >= docBlocks {
						continue
					}
					to := min(docBlocks, from+1+rng.IntN(30))
					e := vllmwire.BlockStored{BlockSize: testBS, TokenIDs: tokens[d][from*testBS : to*testBS]}
					for j := from; j < to; j++ {
						e.BlockHashes = append(e.BlockHashes, engine(d, j))
					}
					if from > 0 {
						e.ParentBlockHash = ptr(engine(d, from-1))
					}
					if rng.IntN(20) == 0 {
						e.Medium = ptr(vllmwire.MediumCPU)
					} else {
						held[wi][d] = to
					}
					ev = e
				case p < 85: // evict a tail
					n := held[wi][d]
					if n == 0 {
						continue
					}
					cut := rng.IntN(n)
					e := vllmwire.BlockRemoved{}
					for j := n - 1; j >= cut; j-- {
						e.BlockHashes = append(e.BlockHashes, engine(d, j))
					}
					held[wi][d] = cut
					ev = e
				case p < 93: // an interior block, or a re-store of one
					j := rng.IntN(docBlocks)
					if rng.IntN(2) == 0 {
						ev = vllmwire.BlockRemoved{BlockHashes: []vllmwire.EngineHash{engine(d, j)}}
						held[wi][d] = min(held[wi][d], j)
					} else {
						e := vllmwire.BlockStored{BlockSize: testBS, TokenIDs: tokens[d][j*testBS : (j+1)*testBS], BlockHashes: []vllmwire.EngineHash{engine(d, j)}}
						if j > 0 {
							e.ParentBlockHash = ptr(engine(d, j-1))
						}
						ev = e
					}
				case p < 95: // an engine key reused for other content
					e := vllmwire.BlockStored{BlockSize: testBS, TokenIDs: tokens[(d+1)%docs][:testBS], BlockHashes: []vllmwire.EngineHash{engine(d, rng.IntN(docBlocks))}}
					ev = e
				case p < 98:
					ev = vllmwire.AllBlocksCleared{}
					for i := range held[wi] {
						held[wi][i] = 0
					}
				default: // a warm start: this worker's holdings from a snapshot
					var buf bytes.Buffer
					if err := ix.WriteSnapshot(&buf, nil); err != nil {
						t.Fatal(err)
					}
					s, err := ReadSnapshot(&buf)
					if err != nil {
						t.Fatal(err)
					}
					for _, sw := range s.Workers {
						if sw.ID == w {
							s.Workers = []SnapshotWorker{sw}
							break
						}
					}
					ix.LoadSnapshot(s)
					checkLinks(t, ix)
					continue
				}
				ix.Apply(w, vllmwire.EventBatch{Events: []vllmwire.Event{ev}})
				checkLinks(t, ix)

				if step%5 != 0 {
					continue
				}
				pd := rng.IntN(docs)
				prompt := routers[pd][:1+rng.IntN(docBlocks)]
				got := ix.Match(prompt, nil, nil)
				want := walkMatch(ix, prompt)
				if len(got) != len(want) {
					t.Fatalf("step %d: %d results, walk %d", step, len(got), len(want))
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("step %d: %+v, walk %+v", step, got[i], want[i])
					}
				}
				compared++
				for _, ws := range ix.slots {
					if ws != nil && ws.blocks > 0 {
						if ws.links.prefixClosed() {
							closedSeen++
						} else {
							openSeen++
						}
					}
				}
			}
			if compared < 300 || closedSeen < 1000 || openSeen < 100 {
				t.Fatalf("%d comparisons, %d closed and %d open workers seen: the stream misses a path", compared, closedSeen, openSeen)
			}
		})
	}
}

func TestInteriorRemovalIsNotJumpedOver(t *testing.T) {
	ix := New(Config{JumpSearch: true})
	ix.AddWorker("w", testModel, testBS)
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 0, 40)}})
	prompt := promptHashes(0, 40)
	match := func() (int, bool) {
		r := ix.Match(prompt, []string{"w"}, nil)[0]
		return r.Blocks, ix.workers["w"].links.prefixClosed()
	}
	if n, closed := match(); n != 40 || !closed {
		t.Fatalf("whole chain: matched %d, closed %v; want 40, true", n, closed)
	}
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{removeEv(0, 20)}})
	if n, closed := match(); n != 20 || closed {
		t.Fatalf("block 20 removed: matched %d, closed %v; want 20, false", n, closed)
	}
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 20, 21)}})
	if n, closed := match(); n != 40 || !closed {
		t.Fatalf("block 20 stored again: matched %d, closed %v; want 40, true", n, closed)
	}
	// A chain under a parent held only in host memory is walked too.
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{withMedium(storeEv(1, 0, 3), vllmwire.MediumCPU), storeEv(1, 3, 30)}})
	if closed := ix.workers["w"].links.prefixClosed(); closed {
		t.Fatal("a chain under an off-device parent: worker still prefix-closed")
	}
	if r := ix.Match(promptHashes(1, 30), []string{"w"}, nil)[0]; r.Blocks != 0 || r.HostBlocks != 3 {
		t.Fatalf("off-device parent: matched %d device and %d host blocks, want 0 and 3", r.Blocks, r.HostBlocks)
	}
}

func TestSnapshotLoadedWorkerIsWalkedUntilCleared(t *testing.T) {
	src := New(Config{JumpSearch: true})
	src.AddWorker("w", testModel, testBS)
	src.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 0, 40), removeEv(0, 10)}})
	var buf bytes.Buffer
	if err := src.WriteSnapshot(&buf, nil); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSnapshot(&buf)
	if err != nil {
		t.Fatal(err)
	}
	ix := New(Config{JumpSearch: true})
	ix.AddWorker("w", testModel, testBS)
	ix.LoadSnapshot(s)
	if ix.workers["w"].links.prefixClosed() {
		t.Fatal("a worker loaded from a snapshot counts as prefix-closed")
	}
	if n := ix.Match(promptHashes(0, 40), nil, nil)[0].Blocks; n != 10 {
		t.Fatalf("loaded worker matched %d, want 10", n)
	}
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}, storeEv(0, 0, 40)}})
	if !ix.workers["w"].links.prefixClosed() {
		t.Fatal("after AllBlocksCleared and a fresh chain the worker is still walked")
	}
	if n := ix.Match(promptHashes(0, 40), nil, nil)[0].Blocks; n != 40 {
		t.Fatalf("matched %d, want 40", n)
	}
}

func TestMatchOverManyWorkersDoesNotAllocate(t *testing.T) {
	ix := New(Config{JumpSearch: true})
	var workers []string
	for i := range 200 {
		workers = append(workers, fmt.Sprint("w", i))
		ix.AddWorker(workers[i], testModel, testBS)
		ix.Apply(workers[i], vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(i%3, 0, 40)}})
	}
	prompt := promptHashes(0, 40)
	out := ix.Match(prompt, workers, nil)
	if out[0].Blocks != 40 || out[1].Blocks != 0 {
		t.Fatalf("matched %d and %d, want 40 and 0", out[0].Blocks, out[1].Blocks)
	}
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose")
	}
	if n := testing.AllocsPerRun(100, func() { out = ix.Match(prompt, workers, out) }); n != 0 {
		t.Fatalf("Match over %d candidates allocates %v times", len(workers), n)
	}
}
