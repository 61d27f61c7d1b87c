package server

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/internal/bus"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// core is one scoring router with the NATS adapters bound to its pool. A
// runtime mode switch builds a new core and retires the old one; requests
// admitted by the old core finish their lifecycle on its pool.
type core struct {
	router *scoring.Scheduler
	cancel context.CancelFunc
	done   []<-chan struct{}
}

// The approximate index learns from the pool's decisions.
var _ scoring.PrefixRecorder = (*kvindex.Approx)(nil)

// newCore builds the scoring router for mode, fills its pool with the
// known fleet and starts load reports, replica sync and the sweeper.
func (r *Server) newCore(mode string) (*core, error) {
	opts := r.cfg.Scoring
	opts.Mode = mode
	if !r.cfg.KVEvents && (mode == scoring.ModeKV || mode == "") {
		opts.Mode = scoring.ModeKVWithoutEvents
	}
	opts.Metrics = r.metrics
	probe, err := scoring.NewMode(opts.Mode, opts)
	if err != nil {
		return nil, err
	}
	if probe.Overlap() == scoring.OverlapApprox {
		opts.Recorder = r.approx
	}
	sr, err := scoring.NewScheduler(opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(r.ctx)
	c := &core{router: sr, cancel: cancel}
	sweep := make(chan struct{})
	go func() { defer close(sweep); sr.Run(ctx) }()
	c.done = append(c.done, sweep)
	lr := bus.NewLoadReports(r.nc, r.cfg.Namespace, sr.Pool())
	if err := lr.Start(ctx); err != nil {
		c.stop()
		return nil, fmt.Errorf("load reports: %w", err)
	}
	c.done = append(c.done, lr.Done())
	if r.cfg.ReplicaSync {
		s := bus.NewSync(r.nc, r.cfg.Namespace, r.cfg.RouterID, sr.Pool())
		if err := s.Start(ctx); err != nil {
			c.stop()
			return nil, fmt.Errorf("replica sync: %w", err)
		}
		c.done = append(c.done, s.Done())
	}
	return c, nil
}

func (c *core) stop() {
	c.cancel()
	for _, d := range c.done {
		<-d
	}
}

// SetMode switches the router mode at runtime (for A/B runs). scoring has
// no mode setter and a Server cannot adopt an existing Pool, so a switch
// builds a new core whose pool gets the current fleet; the Picker then
// moves every request in flight onto it (worker, prefill state, output so
// far; with replica sync they are announced again after the new core's
// reset) and sends requests waiting in the old admission queue through the
// new router. Not carried over: the workers' load reports, refilled by the
// next report (every ~250 ms), and peer replicas' requests admitted before
// the switch, which this replica no longer counts (new ones are counted).
func (r *Server) SetMode(mode string) error {
	r.coreMu.Lock()
	defer r.coreMu.Unlock()
	c, err := r.newCore(mode)
	if err != nil {
		return fmt.Errorf("set mode %q: %w", mode, err)
	}
	old := r.fleet.install(c, r.core.Swap)
	r.picker.SetRouter(c.router)
	if old != nil {
		old.stop()
	}
	r.log.Info("router mode switched", "mode", c.router.Mode().Name())
	return nil
}
