package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/inbox"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
)

// Result is one side's measurement of one workload on some threads; the
// Rust harness prints the same JSON.
type Result struct {
	Side  string `json:"side"`  // "kvroute" or "dynamo"
	Index string `json:"index"` // the index measured
	// Heap is "fresh": the index built in a process that never held one,
	// or "warm": the same index built and dropped once before the clock,
	// so that the timed build reuses memory the runtime already has.
	Heap    string `json:"heap"`
	Workers int    `json:"workers"`
	Threads int    `json:"threads"`
	// Apply: every event of the file into an empty index.
	Events    int     `json:"events"`
	Blocks    int     `json:"blocks"`
	ApplyCPU  float64 `json:"apply_cpu_s"`
	ApplyWall float64 `json:"apply_wall_s"`
	// HashCPU is CPU time spent hashing blocks outside the timed apply:
	// Dynamo's index takes events already hashed (by its relay), kvindex
	// hashes tokens inside Apply, so this is 0 for kvroute.
	HashCPU     float64  `json:"hash_cpu_s"`
	Entries     int      `json:"entries"`
	BytesPerEnt float64  `json:"bytes_per_entry"`
	BytesHow    string   `json:"bytes_how"`
	Lookups     []Lookup `json:"lookups"`
}

// Lookup is the lookups of one query case: Rounds passes over its queries.
type Lookup struct {
	Case     string  `json:"case"`
	Lookups  int     `json:"lookups"`
	CPU      float64 `json:"cpu_s"`
	Wall     float64 `json:"wall_s"`
	Checksum uint64  `json:"checksum"` // sum over queries of every worker's matched blocks
}

// cpuSeconds is the process's user + system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// profileTo, if set, is where measure writes a CPU profile of applying and
// looking up.
var profileTo string

func workerName(i int) string { return fmt.Sprint("w", i) }

const benchModel = "bench-model"

// coreBuffer is the event core's default queue (kvevents.Config.Buffer).
const coreBuffer = 4096

// measureKVIndex drives kvindex.Index with the workload as kvroute's event
// core does: threads goroutines, like transports, queue the events (each
// those of the workers i with i % threads == its number, in file order)
// into the core's queue, and one goroutine takes and applies them. Then it
// looks up every query case on threads goroutines for at least minLookup
// of wall time per case.
func measureKVIndex(w *Workload, threads int, minLookup time.Duration, warm bool) (Result, error) {
	res := Result{Side: "kvroute", Index: "kvindex.Index", Heap: "fresh", Workers: w.Workers, Threads: threads, Events: len(w.Events)}
	// Event batches are built before the clock starts, as decoded events
	// would arrive; Apply re-hashes their tokens.
	type item struct {
		worker string
		batch  vllmwire.EventBatch
	}
	lanes := make([][]item, threads)
	names := make([]string, w.Workers)
	for i := range names {
		names[i] = workerName(i)
	}
	for _, e := range w.Events {
		hs := make([]vllmwire.EngineHash, len(e.Hashes))
		for i, h := range e.Hashes {
			hs[i] = vllmwire.HashUint(h)
		}
		var ev vllmwire.Event
		if e.Kind == kindStored {
			st := vllmwire.BlockStored{BlockHashes: hs, TokenIDs: w.Tokens(e.Contents), BlockSize: w.BlockSize}
			if e.Parent != 0 {
				p := vllmwire.HashUint(e.Parent)
				st.ParentBlockHash = &p
			}
			ev = st
			res.Blocks += len(hs)
		} else {
			ev = vllmwire.BlockRemoved{BlockHashes: hs}
		}
		lane := e.Worker % threads
		lanes[lane] = append(lanes[lane], item{names[e.Worker], vllmwire.EventBatch{Events: []vllmwire.Event{ev}}})
	}
	prompts := make([][][]uint64, len(caseNames))
	seed := kvindex.Seed(benchModel, "", "")
	for _, q := range w.Queries {
		prompts[q.Case] = append(prompts[q.Case], kvindex.HashBlocks(seed, w.Tokens(q.Contents), w.BlockSize, nil))
	}

	if warm {
		res.Heap = "warm"
		wx := kvindex.New(kvindex.Config{})
		for _, n := range names {
			wx.AddWorker(n, benchModel, w.BlockSize)
			wx.Reserve(n, w.Capacity)
		}
		for _, lane := range lanes {
			for _, it := range lane {
				wx.Apply(it.worker, it.batch)
			}
		}
		runtime.KeepAlive(wx)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	ix := kvindex.New(kvindex.Config{})
	for _, n := range names {
		// As kvroute does when a worker's record or load report states
		// its engine's capacity (num_gpu_blocks).
		ix.AddWorker(n, benchModel, w.BlockSize)
		ix.Reserve(n, w.Capacity)
	}
	if profileTo != "" {
		f, err := os.Create(profileTo)
		if err != nil {
			return res, err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, err
		}
		defer pprof.StopCPUProfile()
	}
	var failed sync.Map
	cpu0, wall0 := cpuSeconds(), time.Now()
	applied := make(chan struct{})
	q := inbox.New[item](coreBuffer)
	go func() {
		defer close(applied)
		var batch []item
		for n := 0; n < len(w.Events); {
			<-q.Ready()
			batch = q.Take(batch)
			for _, it := range batch {
				st := ix.Apply(it.worker, it.batch)
				if st.UnknownParent+st.UnknownRemoved+st.Malformed > 0 {
					failed.Store(it.worker, st)
				}
			}
			n += len(batch)
		}
	}()
	var wg sync.WaitGroup
	for _, lane := range lanes {
		wg.Go(func() {
			for _, it := range lane {
				_ = q.Put(context.Background(), nil, it)
			}
		})
	}
	wg.Wait()
	<-applied
	res.ApplyWall = time.Since(wall0).Seconds()
	res.ApplyCPU = cpuSeconds() - cpu0
	bad := 0
	failed.Range(func(k, v any) bool { bad++; return true })
	if bad > 0 {
		return res, fmt.Errorf("kvindex: events of %d workers did not apply cleanly", bad)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(lanes)
	res.Entries = ix.Stats().Entries
	if res.Entries != w.FinalEntries {
		return res, fmt.Errorf("kvindex holds %d entries, the workload %d", res.Entries, w.FinalEntries)
	}
	res.BytesPerEnt = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(res.Entries)
	res.BytesHow = "Go heap in use after GC, after minus before building the index"

	for c, ps := range prompts {
		res.Lookups = append(res.Lookups, lookupKVIndex(ix, caseNames[c], ps, names, threads, minLookup))
	}
	return res, nil
}

// lookupKVIndex matches prompts against every worker, named in one slice
// as the picker passes its pool, in passes over prompts on each of threads
// goroutines, until minLookup has passed.
func lookupKVIndex(ix *kvindex.Index, name string, prompts [][]uint64, workers []string, threads int, minLookup time.Duration) Lookup {
	l := Lookup{Case: name}
	out := make([]kvindex.MatchResult, 0, 1024)
	for _, p := range prompts {
		out = ix.Match(p, workers, out)
		for _, r := range out {
			l.Checksum += uint64(r.Blocks)
		}
	}
	passes := 1
	for {
		cpu0, wall0 := cpuSeconds(), time.Now()
		var wg sync.WaitGroup
		for range threads {
			wg.Go(func() {
				out := make([]kvindex.MatchResult, 0, 1024)
				for range passes {
					for _, p := range prompts {
						out = ix.Match(p, workers, out)
					}
				}
			})
		}
		wg.Wait()
		l.Wall = time.Since(wall0).Seconds()
		l.CPU = cpuSeconds() - cpu0
		l.Lookups = passes * len(prompts) * threads
		if l.Wall >= minLookup.Seconds() {
			return l
		}
		passes *= 2
	}
}
