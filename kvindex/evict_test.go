package kvindex

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// evictRef is the obvious model of what Match must answer on the streams
// below: per worker, each device engine key's router hash, and the engine
// keys held off the device.
type evictRef struct {
	device, off map[string]map[uint64]uint64
}

func (m *evictRef) worker(w string) {
	if m.device[w] == nil {
		m.device[w], m.off[w] = map[uint64]uint64{}, map[uint64]uint64{}
	}
}

// match returns w's leading prompt blocks held on the device and its
// distinct device blocks.
func (m *evictRef) match(w string, prompt []uint64) (blocks, cached int) {
	held := map[uint64]bool{}
	for _, r := range m.device[w] {
		held[r] = true
	}
	for blocks < len(prompt) && held[prompt[blocks]] {
		blocks++
	}
	return blocks, len(held)
}

// checkIndexChains checks the index's chain invariants, counting what
// holds each chain from every worker's engine keys.
func checkIndexChains(t *testing.T, ix *Index, parent func(uint64) uint64) {
	t.Helper()
	refs := map[uint32][2]int64{}
	for _, w := range ix.slots {
		if w == nil {
			continue
		}
		w.device.each(func(_, at uint64) {
			r := refs[uint32(at>>32)]
			r[0]++
			refs[uint32(at>>32)] = r
		})
		for _, oe := range w.offDevice {
			r := refs[uint32(oe.at>>32)]
			r[0]++
			r[1]++
			refs[uint32(oe.at>>32)] = r
		}
	}
	checkChains(t, ix.tab, parent, func(id uint32) (int64, int64) { return refs[id][0], refs[id][1] })
}

// TestMatchAgreesWithReferenceOnEvictionStreams drives the index with
// streams like an engine's (chains extended turn by turn, tails evicted,
// interior blocks removed and stored again, chains under parents held only
// in host memory, engine keys reused for other content, clears, warm
// starts from a snapshot) on 70 workers, and checks Match on every worker
// against evictRef and the chains' invariants after every event.
func TestMatchAgreesWithReferenceOnEvictionStreams(t *testing.T) {
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
			ref := &evictRef{device: map[string]map[uint64]uint64{}, off: map[string]map[uint64]uint64{}}
			ix := New(Config{})
			var workers []string
			for i := range nWorkers {
				workers = append(workers, fmt.Sprint("w", i))
				ix.AddWorker(workers[i], testModel, testBS)
				ref.worker(workers[i])
			}
			// held[w][d] is how many leading blocks of doc d worker w stored,
			// so that most removals take a tail, as engines evict.
			// cpuTo[w][d] is where the last chain w stored in host memory
			// ended: a device chain may go on from there.
			held, cpuTo := make([][]int, nWorkers), make([][]int, nWorkers)
			for i := range held {
				held[i], cpuTo[i] = make([]int, docs), make([]int, docs)
			}
			compared, deep, offParents := 0, 0, 0
			// parentOf is every stored block's parent (0: a root), for
			// the chains' links.
			parentOf := map[uint64]uint64{}
			parent := func(h uint64) uint64 { return parentOf[h] }
			for step := 0; step < 3000; step++ {
				wi := rng.IntN(nWorkers)
				w := workers[wi]
				d := rng.IntN(docs)
				var ev vllmwire.Event
				switch p := rng.IntN(100); {
				case p < 50: // extend a chain
					from := held[wi][d]
					if c := cpuTo[wi][d]; c > from && rng.IntN(2) == 0 {
						from = c // under a parent held in host memory only
					}
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
					if rng.IntN(8) == 0 {
						e.Medium = ptr(vllmwire.MediumCPU)
						cpuTo[wi][d] = to
					} else if from == held[wi][d] {
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
						held[wi][i], cpuTo[wi][i] = 0, 0
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
					checkIndexChains(t, ix, parent)
					continue
				}
				st := ix.Apply(w, vllmwire.EventBatch{Events: []vllmwire.Event{ev}})
				switch e := ev.(type) {
				case vllmwire.BlockStored:
					dev, off := ref.device[w], ref.off[w]
					if p := e.ParentBlockHash; p != nil {
						_, onDev := dev[p.Key()]
						_, onOff := off[p.Key()]
						if !onDev && !onOff {
							if st.UnknownParent != 1 {
								t.Fatalf("step %d: a store under an unknown parent applied", step)
							}
							break
						}
						if !onDev && e.Medium == nil {
							offParents++
						}
					}
					into := dev
					if e.Medium != nil {
						into = off
					}
					prev := Seed(testModel, "", "")
					if p := e.ParentBlockHash; p != nil {
						if r, ok := dev[p.Key()]; ok {
							prev = r
						} else {
							prev = off[p.Key()]
						}
					}
					for i, r := range HashBlocks(prev, e.TokenIDs, testBS, nil) {
						into[e.BlockHashes[i].Key()] = r
						if i == 0 && e.ParentBlockHash == nil {
							parentOf[r] = 0
						} else if i == 0 {
							parentOf[r] = prev
						} else {
							parentOf[r] = into[e.BlockHashes[i-1].Key()]
						}
					}
				case vllmwire.BlockRemoved:
					for _, h := range e.BlockHashes {
						delete(ref.device[w], h.Key())
					}
				case vllmwire.AllBlocksCleared:
					ref.device[w], ref.off[w] = map[uint64]uint64{}, map[uint64]uint64{}
				}
				checkIndexChains(t, ix, parent)

				if step%5 != 0 {
					continue
				}
				pd := rng.IntN(docs)
				prompt := routers[pd][:1+rng.IntN(docBlocks)]
				got := ix.Match(prompt, workers, nil)
				for i, r := range got {
					wb, wc := ref.match(workers[i], prompt)
					if int(r.Blocks) != wb || int(r.Cached) != wc {
						t.Fatalf("step %d: %s matched %d cached %d, reference %d cached %d", step, workers[i], r.Blocks, r.Cached, wb, wc)
					}
					if wb > 20 {
						deep++
					}
				}
				compared++
			}
			if compared < 300 || deep < 1000 || offParents < 30 {
				t.Fatalf("%d comparisons, %d matches past 20 blocks, %d chains under off-device parents: the stream misses a path", compared, deep, offParents)
			}
		})
	}
}

func TestInteriorRemovalEndsTheMatchUntilStoredAgain(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("w", testModel, testBS)
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 0, 40)}})
	prompt := promptHashes(0, 40)
	match := func() int { return int(ix.Match(prompt, []string{"w"}, nil)[0].Blocks) }
	if n := match(); n != 40 {
		t.Fatalf("whole chain: matched %d, want 40", n)
	}
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{removeEv(0, 20)}})
	if n := match(); n != 20 {
		t.Fatalf("block 20 removed: matched %d, want 20", n)
	}
	if n := len(ix.tab.chains[0].cells); n != 40 {
		t.Fatalf("an interior removal cut the chain to %d cells", n)
	}
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 20, 21)}})
	if n := match(); n != 40 {
		t.Fatalf("block 20 stored again: matched %d, want 40", n)
	}
	if ix.tab.count != 1 {
		t.Fatalf("one chain, %d table entries", ix.tab.count)
	}
	// A chain under a parent held only in host memory.
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{withMedium(storeEv(1, 0, 3), vllmwire.MediumCPU), storeEv(1, 3, 30)}})
	if r := ix.Match(promptHashes(1, 30), []string{"w"}, nil)[0]; r.Blocks != 0 || r.HostBlocks != 3 {
		t.Fatalf("off-device parent: matched %d device and %d host blocks, want 0 and 3", r.Blocks, r.HostBlocks)
	}
	// Stored on the device too, the parents join their children's chain.
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3)}})
	if r := ix.Match(promptHashes(1, 30), []string{"w"}, nil)[0]; r.Blocks != 30 {
		t.Fatalf("parents stored on the device: matched %d, want 30", r.Blocks)
	}
	checkIndexChains(t, ix, nil)
}

func TestSnapshotLoadedWorkerMatchesAsItsSource(t *testing.T) {
	src := New(Config{})
	src.AddWorker("w", testModel, testBS)
	src.AddWorker("v", testModel, testBS)
	src.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 0, 40), removeEv(0, 10)}})
	src.Apply("v", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 0, 30)}})
	var buf bytes.Buffer
	if err := src.WriteSnapshot(&buf, nil); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSnapshot(&buf)
	if err != nil {
		t.Fatal(err)
	}
	// The receiver holds part of the same chain already, under another
	// worker: the loaded blocks in the middle of it must join its cells.
	ix := New(Config{})
	for _, id := range []string{"w", "v", "u"} {
		ix.AddWorker(id, testModel, testBS)
	}
	ix.Apply("u", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 0, 35)}})
	ix.LoadSnapshot(s)
	checkIndexChains(t, ix, nil)
	res := ix.Match(promptHashes(0, 40), []string{"w", "v", "u"}, nil)
	if res[0].Blocks != 10 || res[1].Blocks != 30 || res[2].Blocks != 35 {
		t.Fatalf("loaded workers matched %d and %d, the live one %d; want 10, 30, 35", res[0].Blocks, res[1].Blocks, res[2].Blocks)
	}
	// Events after the load chain from the loaded blocks.
	ix.Apply("v", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(0, 30, 40)}})
	if n := ix.Match(promptHashes(0, 40), []string{"v"}, nil)[0].Blocks; n != 40 {
		t.Fatalf("matched %d, want 40", n)
	}
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}}})
	ix.Apply("u", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}}})
	ix.Apply("v", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}}})
	checkIndexChains(t, ix, nil)
	if ix.tab.cells != 0 || ix.tab.count != 0 {
		t.Fatalf("cleared index keeps %d cells, %d table entries", ix.tab.cells, ix.tab.count)
	}
}

func TestMatchOverManyWorkersDoesNotAllocate(t *testing.T) {
	ix := New(Config{})
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
