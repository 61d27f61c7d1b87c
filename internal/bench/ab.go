package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

// ABOptions configures an A/B run over router modes.
type ABOptions struct {
	// Modes are run in order, each from cold caches.
	Modes []string
	Run   RunOptions
	// Progress, when set, receives a progress bar per mode.
	Progress io.Writer
	// ProgressEvery > 0 makes Progress one line per period (for a
	// non-terminal) instead of a bar redrawn in place.
	ProgressEvery time.Duration
	// OnMode, when set, is called after each mode with its result.
	OnMode func(mode string, m *ModeResult)
}

// RunAB replays the workload once per mode against env: before each mode
// it waits for the fleet to go idle, clears every worker's prefix cache
// (the router's index empties through the AllBlocksCleared events) and
// switches the router mode through its admin endpoint. The results go into
// rep under the mode's name.
func RunAB(ctx context.Context, env *Env, c *Client, w *Workload, rep *Report, opt ABOptions) error {
	for _, mode := range opt.Modes {
		if err := env.ResetCaches(ctx); err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		if err := env.SetMode(ctx, mode); err != nil {
			return err
		}
		ro := opt.Run
		var bar *Progress
		if opt.Progress != nil {
			bar = NewProgress(opt.Progress, mode, w.Requests())
			if opt.ProgressEvery > 0 {
				bar = NewProgressLines(opt.Progress, mode, w.Requests(), opt.ProgressEvery)
			}
			ro.Progress = bar.Update
		}
		m, _, err := RunOnFleet(ctx, env.Fleet.Workers(), c, w, ro)
		if bar != nil {
			bar.Done()
		}
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		rep.Add(mode, &m)
		if opt.OnMode != nil {
			opt.OnMode(mode, &m)
		}
	}
	return nil
}

// RunOnFleet replays the workload with c, as Run does, and measures it
// together with the simulated workers' peaks and the clock lag they
// accrued during the run, and returns the results as well. c may point at
// any router in front of the workers: Envoy with kvroute, or another
// router proxying to the same fleet.
func RunOnFleet(ctx context.Context, workers []*sim.Worker, c *Client, w *Workload, ro RunOptions) (ModeResult, []Result, error) {
	stop := sampleFleet(ctx, workers)
	start := time.Now()
	results, err := Run(ctx, c, w, ro)
	wall := time.Since(start)
	sample := stop()
	if err != nil {
		return ModeResult{}, results, err
	}
	m := Measure(results, wall)
	m.Peaks = sample.Peaks
	m.SetClockLag(sample.Lag, wall)
	return m, results, nil
}
