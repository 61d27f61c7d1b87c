package bench

import (
	"context"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

// WorkerPeak is the worst a simulated worker's engine state got during a
// run, sampled every 100 ms: it tells queueing and KV-pool pressure (where
// preemption starts) apart from routing effects.
type WorkerPeak struct {
	Running int `json:"peak_running"`
	Waiting int `json:"peak_waiting"`
	// KVUsage is the peak fraction of KV blocks in use.
	KVUsage float64 `json:"peak_kv_usage"`
}

// sampleFleet records each worker's peaks until ctx ends; the returned
// function stops it and returns the peaks.
func sampleFleet(ctx context.Context, workers []*sim.Worker) func() map[string]WorkerPeak {
	ctx, cancel := context.WithCancel(ctx)
	peaks := make(map[string]WorkerPeak, len(workers))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, w := range workers {
				st := w.Stats()
				p := peaks[w.ID()]
				p.Running = max(p.Running, st.Running)
				p.Waiting = max(p.Waiting, st.Waiting)
				if st.TotalBlocks > 0 {
					p.KVUsage = max(p.KVUsage, float64(st.UsedBlocks)/float64(st.TotalBlocks))
				}
				peaks[w.ID()] = p
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() map[string]WorkerPeak {
		cancel()
		wg.Wait()
		return peaks
	}
}
