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

// fleetSample is what sampleFleet saw during a run.
type fleetSample struct {
	Peaks map[string]WorkerPeak
	// Lag is each worker's clock lag accrued during the run (see
	// sim.WorkerStats.ClockLag).
	Lag map[string]time.Duration
}

// sampleFleet records each worker's peaks until ctx ends; the returned
// function stops it and returns the peaks and the clock lag since the call.
func sampleFleet(ctx context.Context, workers []*sim.Worker) func() fleetSample {
	ctx, cancel := context.WithCancel(ctx)
	peaks := make(map[string]WorkerPeak, len(workers))
	lag0 := make(map[string]time.Duration, len(workers))
	for _, w := range workers {
		lag0[w.ID()] = w.Stats().ClockLag
	}
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
	return func() fleetSample {
		cancel()
		wg.Wait()
		lag := make(map[string]time.Duration, len(workers))
		for _, w := range workers {
			lag[w.ID()] = w.Stats().ClockLag - lag0[w.ID()]
		}
		return fleetSample{Peaks: peaks, Lag: lag}
	}
}

// Clock lag warning thresholds: a run is flagged when a worker's lag
// exceeds the larger of these, as below them the stretch is within the
// noise of a real-time run.
const (
	lagFloor    = 100 * time.Millisecond
	lagFraction = 0.01
)

// LagExceeds reports whether lag distorts a run of length wall: more than
// 100 ms and more than 1 % of wall.
func LagExceeds(lag, wall time.Duration) bool {
	return lag > max(lagFloor, time.Duration(lagFraction*float64(wall)))
}
