package vsim

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
)

// The fleet-scale index: 1,000 workers, each holding a full KV cache of
// 5,632 blocks of 64 tokens, 88 chains of 64 blocks: one of 8 system
// prompts every eighth worker shares, and 87 chains of its own. About
// 5.6 M (block, worker) entries.
const (
	fleetWorkers   = 1000
	fleetBlockSize = 64
	fleetChainLen  = 64
	fleetChains    = 88
	fleetSystems   = 8
)

type fleetIndex struct {
	ix        *kvindex.Index
	workers   []string
	heapBytes int64
	entries   int
}

var (
	fleetOnce    sync.Once
	fleetFixture *fleetIndex
)

// fleetChain is chain c of worker w: its tokens and engine hashes. Chain 0
// is the worker's system prompt, shared with the workers of its group.
func fleetChain(w, c int) ([]uint32, []vllmwire.EngineHash) {
	id := uint64(fleetSystems + w*fleetChains + c)
	if c == 0 {
		id = uint64(w % fleetSystems)
	}
	toks := make([]uint32, fleetChainLen*fleetBlockSize)
	for i := range toks {
		toks[i] = uint32(id*2654435761) ^ uint32(i)*40503 + 1
	}
	hs := make([]vllmwire.EngineHash, fleetChainLen)
	for j := range hs {
		hs[j] = vllmwire.HashUint(id<<20 | uint64(j) + 1)
	}
	return toks, hs
}

func storeEvent(w, c int) vllmwire.EventBatch {
	toks, hs := fleetChain(w, c)
	return vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: fleetBlockSize}}}
}

func loadFleetIndex(b *testing.B) *fleetIndex {
	fleetOnce.Do(func() {
		f := &fleetIndex{}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&before)
		f.ix = kvindex.New(kvindex.Config{})
		for w := 0; w < fleetWorkers; w++ {
			name := fmt.Sprintf("w%02d", w)
			f.workers = append(f.workers, name)
			f.ix.AddWorker(name, "sim", fleetBlockSize)
			for c := 0; c < fleetChains; c++ {
				f.ix.Apply(name, storeEvent(w, c))
			}
		}
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&after)
		f.heapBytes = int64(after.HeapAlloc) - int64(before.HeapAlloc)
		f.entries = f.ix.Stats().Entries
		fleetFixture = f
	})
	return fleetFixture
}

// BenchmarkFleetIndex is the KV index at fleet scale (see fleetWorkers):
// its heap per entry, a Match of a 64-block prompt against all 1,000
// workers (cpu-ns/op), and applying events at steady state (a worker
// drops a 64-block chain and stores it again: 128 blocks per op,
// cpu-blocks/s). Building the index takes a few seconds, once.
func BenchmarkFleetIndex(b *testing.B) {
	f := loadFleetIndex(b)
	if f.entries < fleetWorkers*fleetChains*fleetChainLen {
		b.Fatalf("index holds %d entries, want %d", f.entries, fleetWorkers*fleetChains*fleetChainLen)
	}
	seed := kvindex.Seed("sim", "", "")
	b.Run("match", func(b *testing.B) {
		var prompts [][]uint64
		for w := 0; w < 64; w++ {
			// A session chain is a root chain of its own, held by one
			// worker; "system" matches the shared ones.
			toks, _ := fleetChain(w*15, 1+w%(fleetChains-1))
			prompts = append(prompts, kvindex.HashBlocks(seed, toks, fleetBlockSize, nil))
		}
		matchBench(b, f, prompts, 1)
	})
	b.Run("system", func(b *testing.B) {
		var prompts [][]uint64
		for s := 0; s < fleetSystems; s++ {
			toks, _ := fleetChain(s, 0)
			prompts = append(prompts, kvindex.HashBlocks(seed, toks, fleetBlockSize, nil))
		}
		matchBench(b, f, prompts, fleetWorkers/fleetSystems)
	})
	b.Run("apply", func(b *testing.B) {
		b.ReportAllocs()
		var cpu time.Duration
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := 0; b.Loop(); i++ {
			w, c := i%fleetWorkers, 1+(i/fleetWorkers)%(fleetChains-1)
			toks, hs := fleetChain(w, c)
			remove := vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockRemoved{BlockHashes: hs}}}
			store := vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: fleetBlockSize}}}
			t := threadCPU()
			f.ix.Apply(f.workers[w], remove)
			f.ix.Apply(f.workers[w], store)
			cpu += threadCPU() - t
		}
		if cpu > 0 {
			b.ReportMetric(float64(b.N*2*fleetChainLen)/cpu.Seconds(), "cpu-blocks/s")
		}
		if got := f.ix.Stats().Entries; got != f.entries {
			b.Fatalf("steady state holds %d entries, want %d", got, f.entries)
		}
	})
}

// matchBench matches prompts against every worker and checks that some
// want workers hold each one.
func matchBench(b *testing.B, f *fleetIndex, prompts [][]uint64, want int) {
	out := make([]kvindex.MatchResult, 0, len(f.workers))
	b.ReportAllocs()
	var cpu time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := 0; b.Loop(); i++ {
		t := threadCPU()
		out = f.ix.Match(prompts[i%len(prompts)], f.workers, out)
		cpu += threadCPU() - t
		if i < len(prompts) {
			held := 0
			for _, r := range out {
				if r.Blocks == fleetChainLen {
					held++
				}
			}
			if held != want {
				b.Fatalf("prompt %d is held whole by %d workers, want %d", i, held, want)
			}
		}
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(f.entries), "entries")
	b.ReportMetric(float64(f.heapBytes)/float64(f.entries), "heap-bytes/entry")
	b.ReportMetric(float64(f.heapBytes)/(1<<20), "heap-MB")
}
