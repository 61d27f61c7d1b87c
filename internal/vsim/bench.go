package vsim

import (
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
)

// BenchWorkload turns w into a workload for the real-time harness
// (kvbench demo and replay): one flow per session, its turns sent one
// after the other with the think time between, each prompt carrying the
// tokens kvsim workers of cfg will have generated for the turn before, so
// a follow-up matches its worker's cache as it does in simulation.
// Sessions start at Start ÷ timeScale and think for Think ÷ timeScale;
// only the first sessions are kept when maxRequests (if positive) would be
// exceeded.
func (w *Workload) BenchWorkload(cfg sim.EngineConfig, model string, timeScale float64, maxRequests int) *bench.Workload {
	if !(timeScale > 0) {
		timeScale = 1
	}
	out := &bench.Workload{Name: w.Name, Params: map[string]any{"time_scale": timeScale, "model": model}}
	for k, v := range w.Params {
		out.Params[k] = v
	}
	n := 0
	for s := range w.Sessions {
		sess := &w.Sessions[s]
		if maxRequests > 0 && n+len(sess.Turns) > maxRequests {
			break
		}
		fl := bench.Flow{
			At:    time.Duration(float64(sess.Start) / timeScale),
			Think: time.Duration(float64(sess.Think) / timeScale),
		}
		var hist []int32
		for i := range sess.Turns {
			t := &sess.Turns[i]
			hist = w.appendPrompt(hist, t)
			prompt := append([]int32(nil), hist...)
			it := bench.CompletionItem(model, prompt, t.Output)
			if i > 0 {
				it.Follows = &bench.ItemRef{Flow: len(out.Flows), Item: i - 1}
			}
			fl.Items = append(fl.Items, it)
			if i+1 < len(sess.Turns) {
				hist = sim.AppendGenerated(cfg, hist, t.Output, hist)
			}
		}
		out.Flows = append(out.Flows, fl)
		n += len(sess.Turns)
	}
	return out
}
