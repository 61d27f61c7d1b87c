package kvindex

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

const benchBS = 16

// benchChain returns the tokens and engine hashes of a chain of n blocks
// of benchBS tokens, unique per id.
func benchChain(id, n int) ([]uint32, []vllmwire.EngineHash) {
	toks := make([]uint32, n*benchBS)
	for i := range toks {
		toks[i] = uint32(id)*7919 + uint32(i)*31 + 1
	}
	hs := make([]vllmwire.EngineHash, n)
	for j := range hs {
		hs[j] = vllmwire.HashUint(uint64(id)<<24 | uint64(j) + 1)
	}
	return toks, hs
}

// BenchmarkApplyStored measures applying BlockStored events of 16 blocks
// (block size 16) to a fleet of 16 workers. "steady" is a full cache: every
// batch also evicts the 16 blocks the worker stored 1024 batches ago, so the
// index stays at 16 × 16384 entries; "grow" only stores, starting over on
// a fresh index every 4 M entries.
func BenchmarkApplyStored(b *testing.B) {
	const (
		workers   = 16
		perBatch  = 16
		pool      = 8192 // distinct batches
		keepBatch = 1024 // batches a worker holds at steady state (16384 blocks)
	)
	stores := make([]vllmwire.EventBatch, pool)
	removes := make([]vllmwire.EventBatch, pool)
	for i := range stores {
		toks, hs := benchChain(i, perBatch)
		stores[i] = vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: benchBS, Medium: ptr(vllmwire.MediumGPU)}}}
		removes[i] = vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockRemoved{BlockHashes: hs, Medium: ptr(vllmwire.MediumGPU)}}}
	}
	names := make([]string, workers)
	for w := range names {
		names[w] = fmt.Sprint("w", w)
	}
	newIndex := func() *Index {
		ix := New(Config{})
		for _, n := range names {
			ix.AddWorker(n, "bench-model", benchBS)
		}
		return ix
	}
	b.Run("steady", func(b *testing.B) {
		ix := newIndex()
		// Warm up to the steady state outside the timer.
		for i := 0; i < workers*keepBatch; i++ {
			w := i % workers
			ix.Apply(names[w], stores[(i/workers+w*keepBatch/2)%pool])
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpu := startCPU()
		for i := workers * keepBatch; i < workers*keepBatch+b.N; i++ {
			w := i % workers
			k := i/workers + w*keepBatch/2
			ix.Apply(names[w], removes[(k-keepBatch)%pool])
			ix.Apply(names[w], stores[k%pool])
		}
		b.StopTimer()
		reportCPU(b, cpu, perBatch, "blocks/s")
		b.ReportMetric(float64(b.N*perBatch)/b.Elapsed().Seconds(), "blocks/s")
		if s := ix.Stats(); s.Entries != workers*keepBatch*perBatch {
			b.Fatalf("steady state holds %d entries, want %d", s.Entries, workers*keepBatch*perBatch)
		}
	})
	b.Run("grow", func(b *testing.B) {
		ix := newIndex()
		b.ReportAllocs()
		held := 0
		cpu := startCPU()
		for i := 0; i < b.N; i++ {
			if held >= 4<<20 {
				ix, held = newIndex(), 0
			}
			w := i % workers
			ix.Apply(names[w], stores[(i/workers)%pool])
			held += perBatch
		}
		reportCPU(b, cpu, perBatch, "blocks/s")
		b.ReportMetric(float64(b.N*perBatch)/b.Elapsed().Seconds(), "blocks/s")
	})
}

// matchFixture is 64 workers holding 10 M (block, worker) entries: 2,000
// conversations of 512 blocks, each worker holding 305 of them at random,
// so a conversation sits on about 10 workers.
type matchFixture struct {
	ix        *Index
	workers   []string
	prompts   [][]uint64 // router hashes of whole conversations
	entries   int
	heapBytes uint64
}

var (
	fixtureOnce sync.Once
	fixture     *matchFixture
)

func loadMatchFixture(b *testing.B) *matchFixture {
	fixtureOnce.Do(func() {
		const (
			nWorkers = 64
			convs    = 2000
			convLen  = 512
			perW     = 305
		)
		f := &matchFixture{}
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		f.ix = New(Config{})
		seed := Seed("bench-model", "", "")
		events := make([]vllmwire.EventBatch, convs)
		for c := range events {
			toks, hs := benchChain(c, convLen)
			events[c] = vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: benchBS}}}
			f.prompts = append(f.prompts, HashBlocks(seed, toks, benchBS, nil))
		}
		rng := rand.New(rand.NewPCG(1, 2))
		for w := 0; w < nWorkers; w++ {
			name := fmt.Sprint("w", w)
			f.workers = append(f.workers, name)
			f.ix.AddWorker(name, "bench-model", benchBS)
			for _, c := range rng.Perm(convs)[:perW] {
				f.ix.Apply(name, events[c])
			}
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		f.entries = f.ix.Stats().Entries
		// The prompts' own hashes are not index memory.
		f.heapBytes = after.HeapAlloc - before.HeapAlloc - uint64(convs*convLen*8)
		fixture = f
	})
	return fixture
}

// BenchmarkMatch matches a 512-block prompt against all 64 workers of a
// 10 M-entry index: "full" prompts are whole conversations (every block is
// looked up), "partial" ones share 100 blocks and then diverge.
func BenchmarkMatch(b *testing.B) {
	f := loadMatchFixture(b)
	if f.entries < 9_900_000 {
		b.Fatalf("fixture holds %d entries, want 10 M", f.entries)
	}
	for _, tc := range []struct {
		name    string
		prompts [][]uint64
	}{{"full", f.prompts}, {"partial", partialPrompts(f)}} {
		b.Run(tc.name, func(b *testing.B) {
			out := make([]MatchResult, 0, len(f.workers))
			matched := 0
			b.ReportAllocs()
			b.ResetTimer()
			cpu := startCPU()
			for i := 0; i < b.N; i++ {
				out = f.ix.Match(tc.prompts[i%len(tc.prompts)], f.workers, out)
				for _, r := range out {
					matched = max(matched, int(r.Blocks))
				}
			}
			b.StopTimer()
			reportCPU(b, cpu, 0, "")
			if matched == 0 {
				b.Fatal("nothing matched")
			}
			b.ReportMetric(float64(f.entries), "entries")
			b.ReportMetric(float64(f.heapBytes)/float64(f.entries), "bytes/entry")
		})
	}
}

var (
	disjointOnce     sync.Once
	disjointIndex    *Index
	disjointPerEntry float64
)

// BenchmarkIndexMemoryDisjoint is the worst case for memory: 64 workers
// with no block in common (every entry is its own table row), 2 M entries.
// The index is built once per process; b.N only repeats a cheap Stats call.
func BenchmarkIndexMemoryDisjoint(b *testing.B) {
	disjointOnce.Do(func() {
		const nWorkers, chains, chainLen = 64, 16, 2048
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		ix := New(Config{})
		for w := 0; w < nWorkers; w++ {
			name := fmt.Sprint("w", w)
			ix.AddWorker(name, "bench-model", benchBS)
			for c := 0; c < chains; c++ {
				toks, hs := benchChain(w*chains+c, chainLen)
				ix.Apply(name, vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: benchBS}}})
			}
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		disjointIndex = ix
		disjointPerEntry = float64(after.HeapAlloc-before.HeapAlloc) / float64(ix.Stats().Entries)
	})
	b.ResetTimer()
	var s Stats
	for i := 0; i < b.N; i++ {
		s = disjointIndex.Stats()
	}
	b.StopTimer()
	b.ReportMetric(float64(s.Entries), "entries")
	b.ReportMetric(disjointPerEntry, "bytes/entry")
}

// BenchmarkHashBlocks hashes a 512-block prompt of block size 16.
func BenchmarkHashBlocks(b *testing.B) {
	toks, _ := benchChain(1, 512)
	dst := make([]uint64, 0, 512)
	b.SetBytes(int64(len(toks) * 4))
	b.ReportAllocs()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		dst = HashBlocks(42, toks, benchBS, dst[:0])
	}
	reportCPU(b, cpu, 512, "blocks/s")
	b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkApproxMatch matches a 512-block prompt against 64 workers of an
// approximate index at its default size (2^20 blocks).
func BenchmarkApproxMatch(b *testing.B) {
	a := NewApprox(ApproxConfig{})
	seed := Seed("bench-model", "", "")
	var prompts [][]uint64
	for c := 0; c < 2048; c++ {
		toks, _ := benchChain(c, 512)
		prompts = append(prompts, HashBlocks(seed, toks, benchBS, nil))
		a.Record(fmt.Sprint("w", c%64), prompts[c])
	}
	workers := make([]string, 64)
	for i := range workers {
		workers[i] = fmt.Sprint("w", i)
	}
	out := make([]MatchResult, 0, 64)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		out = a.Match(prompts[len(prompts)-1-i%512], workers, out)
	}
	reportCPU(b, cpu, 0, "")
}

// BenchmarkMatchFloor is the floor of any layout that looks every block
// up on its own: the same prompts over the same blocks, but packed into a
// flat array with no empty slot (in random order, as a hash table
// scatters them) and every key's position known in advance (found outside
// the timer): each block costs exactly one load at a random place and no
// key is ever probed for. The walk keeps Match's shape: the loads of 16
// keys issued back to back, the workers' bits and-ed down, stop when none
// is left. Match reads a prompt's blocks in chains instead (chains.go), so
// it goes below this floor: Match's figure divided by this one is what
// the chains save over the best walk of one load per block.
func BenchmarkMatchFloor(b *testing.B) {
	f := loadMatchFixture(b)
	fl := newMatchFloor(f)
	for _, tc := range []struct {
		name    string
		prompts [][]uint64
	}{{"full", f.prompts}, {"partial", partialPrompts(f)}} {
		slots := fl.slotsOf(tc.prompts)
		b.Run(tc.name, func(b *testing.B) {
			var depth [64]int32
			matched := int32(0)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := startCPU()
			for i := 0; i < b.N; i++ {
				k := i % len(tc.prompts)
				floorWalk(fl.flat, tc.prompts[k], slots[k], ^uint64(0), depth[:])
				for _, d := range depth {
					matched = max(matched, d)
				}
			}
			b.StopTimer()
			reportCPU(b, cpu, 0, "")
			if matched == 0 {
				b.Fatal("nothing matched")
			}
		})
	}
}

// matchFloor is the fixture's held blocks packed flat, every one once, in
// random order, with each key's position.
type matchFloor struct {
	flat []oaSlot
	pos  map[uint64]int32
}

func newMatchFloor(f *matchFixture) *matchFloor {
	t := f.ix.tab
	fl := &matchFloor{pos: make(map[uint64]int32, t.cells)}
	for _, ch := range t.chains {
		for _, cl := range ch.cells {
			if cl.set == 0 {
				continue
			}
			// The floor reads a 64-bit set per block, as a fleet of 64
			// workers could at best.
			var set uint64
			for _, m := range members(&t.holderSets, cl.set) {
				set |= 1 << m
			}
			fl.pos[cl.hash] = int32(len(fl.flat))
			fl.flat = append(fl.flat, oaSlot{key: cl.hash, val: set})
		}
	}
	// In a hash table's order, as the walk of one probe per block would
	// find them.
	rng := rand.New(rand.NewPCG(3, 3))
	rng.Shuffle(len(fl.flat), func(i, j int) { fl.flat[i], fl.flat[j] = fl.flat[j], fl.flat[i] })
	for i, s := range fl.flat {
		fl.pos[s.key] = int32(i)
	}
	return fl
}

// slotsOf returns the flat positions of every prompt's keys, -1 where a
// key is not in the table.
func (fl *matchFloor) slotsOf(prompts [][]uint64) [][]int32 {
	out := make([][]int32, len(prompts))
	for i, p := range prompts {
		for _, h := range p {
			k, ok := fl.pos[h]
			if !ok {
				k = -1
			}
			out[i] = append(out[i], k)
		}
	}
	return out
}

// partialPrompts are the fixture's prompts sharing their first 100 blocks
// and then diverging.
func partialPrompts(f *matchFixture) [][]uint64 {
	partial := make([][]uint64, len(f.prompts))
	for i, p := range f.prompts {
		partial[i] = append(append([]uint64{}, p[:100]...), HashBlocks(p[99], make([]uint32, 412*benchBS), benchBS, nil)...)
	}
	return partial
}

// BenchmarkMatchVsFloor runs BenchmarkMatch and BenchmarkMatchFloor
// interleaved in one process: each of b.N rounds matches every fixture
// prompt once, then walks the floor over every prompt once, each timed in
// CPU time. Taking the ratio within a round cancels most of what a shared
// machine does to both; it reports the medians of each side and of the
// per-round ratios, and the range of the ratios. It also walks a second
// floor that prefetches like walk does (floorWalkPrefetched): Match's
// distance from the best walk using the same technique. Run it with -benchtime Nx
// for N rounds (at least 3).
func BenchmarkMatchVsFloor(b *testing.B) {
	f := loadMatchFixture(b)
	fl := newMatchFloor(f)
	for _, tc := range []struct {
		name    string
		prompts [][]uint64
	}{{"full", f.prompts}, {"partial", partialPrompts(f)}} {
		slots := fl.slotsOf(tc.prompts)
		b.Run(tc.name, func(b *testing.B) {
			out := make([]MatchResult, 0, len(f.workers))
			var depth [64]int32
			var matchNs, floorNs, ratios, pfNs, pfRatios []float64
			n := float64(len(tc.prompts))
			b.ResetTimer()
			for r := 0; r < b.N; r++ {
				cpu := startCPU()
				for _, p := range tc.prompts {
					out = f.ix.Match(p, f.workers, out)
				}
				m, _ := cpu.stop()
				cpu = startCPU()
				for k, p := range tc.prompts {
					floorWalk(fl.flat, p, slots[k], ^uint64(0), depth[:])
				}
				fw, _ := cpu.stop()
				cpu = startCPU()
				for k, p := range tc.prompts {
					floorWalkPrefetched(fl.flat, p, slots[k], ^uint64(0), depth[:])
				}
				pw, _ := cpu.stop()
				if m <= 0 || fw <= 0 || pw <= 0 {
					b.Skip("no thread CPU clock here")
				}
				pfNs = append(pfNs, float64(pw.Nanoseconds())/n)
				pfRatios = append(pfRatios, float64(m)/float64(pw))
				matchNs = append(matchNs, float64(m.Nanoseconds())/n)
				floorNs = append(floorNs, float64(fw.Nanoseconds())/n)
				ratios = append(ratios, float64(m)/float64(fw))
			}
			b.StopTimer()
			b.ReportMetric(median(matchNs), "match-cpu-ns")
			b.ReportMetric(median(floorNs), "floor-cpu-ns")
			b.ReportMetric(median(ratios), "x-floor")
			b.ReportMetric(slices.Min(ratios), "x-floor-min")
			b.ReportMetric(slices.Max(ratios), "x-floor-max")
			b.ReportMetric(median(pfNs), "pf-floor-cpu-ns")
			b.ReportMetric(median(pfRatios), "x-pf-floor")
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// floorWalk is walk with the slot of every key given: one load per key.
func floorWalk(slots []oaSlot, hashes []uint64, at []int32, alive uint64, depth []int32) {
	floorWalkAhead(slots, hashes, at, alive, depth, false)
}

// floorWalkPrefetched is floorWalk prefetching walkAhead chunks ahead, as
// walk does: not the floor BenchmarkMatchFloor reports, but the same
// technique applied to the ideal walk.
func floorWalkPrefetched(slots []oaSlot, hashes []uint64, at []int32, alive uint64, depth []int32) {
	floorWalkAhead(slots, hashes, at, alive, depth, true)
}

func floorWalkAhead(slots []oaSlot, hashes []uint64, at []int32, alive uint64, depth []int32, ahead bool) {
	n := len(hashes)
	prefetch := func(c int) {
		var pos [matchChunk]int
		m := 0
		for _, k := range at[min(c*matchChunk, n):min((c+1)*matchChunk, n)] {
			if k >= 0 {
				pos[m] = int(k)
				m++
			}
		}
		if m > 0 {
			prefetchSlots(slots, pos[:m])
		}
	}
	if ahead {
		for c := 0; c < walkAhead; c++ {
			prefetch(c)
		}
	}
	for c, d := 0, 0; d < n; c, d = c+1, d+matchChunk {
		if ahead {
			prefetch(c + walkAhead)
		}
		end := min(d+matchChunk, n)
		var got [matchChunk]uint64
		for j := d; j < end; j++ {
			if k := at[j]; k >= 0 && slots[k].key == hashes[j] {
				got[j-d] = slots[k].val
			}
		}
		for j := d; j < end; j++ {
			dying := alive &^ got[j-d]
			for dying != 0 {
				b := bits.TrailingZeros64(dying)
				dying &= dying - 1
				depth[b] = int32(j)
			}
			alive &= got[j-d]
			if alive == 0 {
				return
			}
		}
	}
	for alive != 0 {
		b := bits.TrailingZeros64(alive)
		alive &= alive - 1
		depth[b] = int32(n)
	}
}
