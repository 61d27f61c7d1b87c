package scoring

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
)

// refsModel is blockRefs' specification: the Go map it replaced, written
// the way releaseLocked and chargeLocked wrote it.
type refsModel map[uint64]int32

func (m refsModel) add(hs []uint64) {
	for _, h := range hs {
		m[h]++
	}
}

func (m refsModel) release(hs []uint64) {
	for _, h := range hs {
		if n := m[h]; n <= 1 {
			delete(m, h)
		} else {
			m[h] = n - 1
		}
	}
}

// checkRefs compares t with m over every hash in keys, and checks that
// every slot's hash is reachable from its home.
func checkRefs(t *testing.T, step int, got *blockRefs, want refsModel, keys []uint64) {
	t.Helper()
	if got.len() != len(want) {
		t.Fatalf("step %d: len %d, want %d", step, got.len(), len(want))
	}
	for _, h := range keys {
		if got.count(h) != want[h] {
			t.Fatalf("step %d: count(%#x) = %d, want %d", step, h, got.count(h), want[h])
		}
	}
	checkTable(t, step, &got.hashTable, func(n int32) bool { return n > 0 })
}

// checkTable checks that every slot's hash is reachable from its home,
// that used counts the slots in use, that empty slots hold the zero V and
// that every value held passes ok.
func checkTable[V comparable](t *testing.T, step int, tab *hashTable[V], ok func(V) bool) {
	t.Helper()
	var zero V
	used := 0
	for i, s := range tab.slots {
		if s.hash == 0 {
			if s.v != zero {
				t.Fatalf("step %d: empty slot %d holds %v", step, i, s.v)
			}
			continue
		}
		used++
		if tab.find(s.hash) != i {
			t.Fatalf("step %d: slot %d's hash %#x found at %d", step, i, s.hash, tab.find(s.hash))
		}
		if !ok(s.v) {
			t.Fatalf("step %d: slot %d holds %#x with %v", step, i, s.hash, s.v)
		}
	}
	if used != tab.used {
		t.Fatalf("step %d: %d slots in use, used says %d", step, used, tab.used)
	}
}

// TestBlockRefsIsTheMap drives the table and the map it replaced with the
// same random batches (shared prefixes, repeated and absent hashes, hash
// 0, key spaces small enough to collide and large enough to grow the
// table) and compares every count after every batch.
func TestBlockRefsIsTheMap(t *testing.T) {
	for seed := range uint64(40) {
		g := rand.New(rand.NewPCG(seed, 7))
		space := []int{4, 50, 600, 5000}[seed%4]
		keys := make([]uint64, space)
		for i := range keys {
			switch {
			case i == 0:
				keys[i] = 0
			case seed%3 == 0:
				keys[i] = uint64(i) // sequential hashes: the mix must spread them
			case seed%3 == 1:
				keys[i] = uint64(i) << 40 // differing only in high bits
			default:
				keys[i] = g.Uint64()
			}
		}
		var got blockRefs
		want := refsModel{}
		var held [][]uint64 // batches added and not yet released
		for step := range 400 {
			if len(held) > 0 && g.IntN(2) == 0 {
				k := g.IntN(len(held))
				hs := held[k]
				held = append(held[:k], held[k+1:]...)
				got.release(hs)
				want.release(hs)
			} else if g.IntN(10) == 0 {
				// Releasing what was never added, or added and released
				// already, changes nothing but counts already there.
				hs := make([]uint64, g.IntN(20))
				for i := range hs {
					hs[i] = keys[g.IntN(len(keys))]
				}
				got.release(hs)
				want.release(hs)
			} else {
				start := g.IntN(len(keys))
				hs := make([]uint64, g.IntN(min(300, len(keys))+1))
				for i := range hs {
					if g.IntN(8) == 0 {
						hs[i] = keys[g.IntN(len(keys))]
					} else {
						hs[i] = keys[(start+i)%len(keys)]
					}
				}
				got.add(hs)
				want.add(hs)
				held = append(held, hs)
			}
			checkRefs(t, step, &got, want, keys)
		}
		for _, hs := range held {
			got.release(hs)
			want.release(hs)
		}
		checkRefs(t, -1, &got, want, keys)
		if got.len() != 0 {
			t.Fatalf("seed %d: %d hashes left after every release", seed, got.len())
		}
	}
}

func TestBlockRefsZeroValue(t *testing.T) {
	var r blockRefs
	r.release([]uint64{1, 0, 2})
	if r.len() != 0 || r.count(1) != 0 || r.count(0) != 0 {
		t.Fatalf("empty table: len %d, count(1) %d, count(0) %d", r.len(), r.count(1), r.count(0))
	}
	r.add([]uint64{0, 0, 5})
	if r.len() != 2 || r.count(0) != 2 || r.count(5) != 1 {
		t.Fatalf("after add: len %d, count(0) %d, count(5) %d", r.len(), r.count(0), r.count(5))
	}
}

// BenchmarkBlockRefs adds and releases one request's prompt blocks on one
// of a fleet's workers at a time, each worker holding its share of other
// requests' blocks, so that the tables are as cold as in a large fleet:
// the Add and Free of a 1,000-worker router. The map rows are the Go map
// blockRefs replaced, for comparison.
func BenchmarkBlockRefs(b *testing.B) {
	const blocks = 256
	for _, workers := range []int{8, 1000} {
		g := rand.New(rand.NewPCG(1, 2))
		prompts := make([][]uint64, workers)
		for i := range prompts {
			prompts[i] = make([]uint64, blocks)
			for k := range prompts[i] {
				prompts[i][k] = g.Uint64()
			}
		}
		background := func(add func(w int, hs []uint64)) {
			for w := range workers {
				for range 4 {
					hs := make([]uint64, blocks)
					for k := range hs {
						hs[k] = g.Uint64()
					}
					add(w, hs)
				}
			}
		}
		b.Run(fmt.Sprintf("table/workers=%d", workers), func(b *testing.B) {
			tables := make([]blockRefs, workers)
			background(func(w int, hs []uint64) { tables[w].add(hs) })
			for w := range tables {
				tables[w].add(prompts[w]) // sized for the prompt too
				tables[w].release(prompts[w])
			}
			b.ReportAllocs()
			w := 0
			for b.Loop() {
				tables[w].add(prompts[w])
				tables[w].release(prompts[w])
				w = (w + 1) % workers
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/request")
		})
		b.Run(fmt.Sprintf("map/workers=%d", workers), func(b *testing.B) {
			maps := make([]refsModel, workers)
			for w := range maps {
				maps[w] = refsModel{}
			}
			background(func(w int, hs []uint64) { maps[w].add(hs) })
			b.ReportAllocs()
			w := 0
			for b.Loop() {
				maps[w].add(prompts[w])
				maps[w].release(prompts[w])
				w = (w + 1) % workers
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/request")
		})
	}
}

// TestPendingTableIsTheMap drives the pending overlay's table (its get,
// set, remove and reset) and a Go map with the same random steps, hash 0
// among the keys, key spaces small enough to collide and large enough to
// grow the table, and compares them after every step.
func TestPendingTableIsTheMap(t *testing.T) {
	for seed := range uint64(20) {
		g := rand.New(rand.NewPCG(seed, 11))
		space := []uint64{3, 40, 700, 1 << 40}[seed%4]
		var pb pendingBlocks
		want := map[uint64]pendingEntry{}
		key := func() uint64 {
			if seed%2 == 0 {
				return g.Uint64N(space) // small sequential hashes
			}
			return g.Uint64N(space) << 20
		}
		for step := range 3000 {
			switch op := g.IntN(20); {
			case op == 0 && g.IntN(20) == 0:
				pb.reset()
				clear(want)
			case op < 9:
				h, e := key(), pendingEntry{until: g.Int64(), after: g.Int32()}
				pb.until.reserve(1)
				pb.set(h, e)
				want[h] = e
			case op < 15:
				h := key()
				pb.remove(h)
				delete(want, h)
			default:
				h := key()
				e, ok := pb.get(h)
				w, wok := want[h]
				if ok != wok || e != w {
					t.Fatalf("seed %d step %d: get(%#x) = %v %v, want %v %v", seed, step, h, e, ok, w, wok)
				}
			}
			if pb.entries() != len(want) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, pb.entries(), len(want))
			}
			if got := pendingEntries(&pb); !maps.Equal(got, want) {
				t.Fatalf("seed %d step %d: the table holds %v, want %v", seed, step, got, want)
			}
			checkTable(t, step, &pb.until, func(pendingEntry) bool { return true })
		}
	}
}
