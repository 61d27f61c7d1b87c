package kvevents_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
)

// processCPU is the process's user and system CPU time: the core applies
// on its own goroutine, so the benchmark's thread alone would miss it.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCoreDeliver: two transports deliver a steady stream of KV event
// batches (16 blocks stored, the worker's previous 16 removed) round
// robin over 64 workers, and the core decodes and applies them. It
// reports the process's CPU per batch: the core's handling, the index's
// apply and the hand-over between the goroutines.
func BenchmarkCoreDeliver(b *testing.B) {
	const workers, ring, blocks = 64, 8, 16
	ix := kvindex.New(kvindex.Config{})
	names := make([]string, workers)
	for w := range names {
		names[w] = fmt.Sprint("w", w)
		ix.AddWorker(names[w], model, bs)
	}
	// payloads[w][k] stores set k of worker w and removes set k-1, so that
	// the index holds one set per worker.
	hash := func(w, k, j int) vllmwire.EngineHash {
		return vllmwire.HashUint(uint64(w)<<32 | uint64(k)<<8 | uint64(j) + 1)
	}
	payloads := make([][][]byte, workers)
	for w := range payloads {
		for k := range ring {
			stored := vllmwire.BlockStored{BlockSize: bs}
			var removed vllmwire.BlockRemoved
			for j := range blocks {
				stored.BlockHashes = append(stored.BlockHashes, hash(w, k, j))
				removed.BlockHashes = append(removed.BlockHashes, hash(w, (k+ring-1)%ring, j))
				for t := range bs {
					stored.TokenIDs = append(stored.TokenIDs, uint32(w<<20|k<<12|j<<5|t))
				}
			}
			data, err := vllmwire.EncodeBatch(vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{removed, stored}})
			if err != nil {
				b.Fatal(err)
			}
			payloads[w] = append(payloads[w], data)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	core := kvevents.New(kvevents.Config{Index: ix, Logger: quiet})
	if err := core.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0 := processCPU(b)
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Go(func() {
			seq := make([]uint64, workers)
			for i := p; i < b.N; i += 2 {
				w := i % workers
				d := kvevents.Delivery{Worker: names[w], Seq: seq[w], Payload: payloads[w][int(seq[w])%ring]}
				seq[w]++
				if err := core.Deliver(ctx, d); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for core.Stats().Batches < uint64(b.N) {
		time.Sleep(100 * time.Microsecond)
	}
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	if st := core.Stats(); st.Applied != uint64(b.N) {
		b.Fatalf("applied %d of %d batches (%+v)", st.Applied, b.N, st)
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/batch")
}
