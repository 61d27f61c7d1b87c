package server

import (
	"fmt"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// The approximate index learns from the scheduler's decisions; the
// scheduler's pending overlay follows the KV index.
var (
	_ scoring.PrefixRecorder  = (*kvindex.Approx)(nil)
	_ kvindex.Observer        = (*scoring.Pool)(nil)
	_ kvindex.RemovalObserver = (*scoring.Pool)(nil)
)

// effectiveMode is the mode the scheduler runs for the asked one: without
// KV events, kv routes on the approximate index.
func (r *Server) effectiveMode(mode string) string {
	if !r.cfg.KVEvents && (mode == scoring.ModeKV || mode == "") {
		return scoring.ModeKVWithoutEvents
	}
	return mode
}

// newScheduler builds the one scoring scheduler of this instance, in the
// configured mode. Its pool lives as long as the Server; SetMode swaps
// only the mode.
func (r *Server) newScheduler() (*scoring.Scheduler, error) {
	opts := r.cfg.Scoring
	opts.Mode = r.effectiveMode(opts.Mode)
	opts.Metrics = ejectionLog{r.metrics, r}
	opts.Recorder = approxRecorder{r}
	s, err := scoring.NewScheduler(opts)
	if err == nil {
		r.index.SetObserver(s.Pool())
	}
	return s, err
}

// approxRecorder feeds the approximate index while the mode in use routes
// on it (kv_without_events), and ignores decisions otherwise.
type approxRecorder struct{ r *Server }

func (a approxRecorder) Record(worker string, hashes []uint64) {
	if a.r.sched.Load().Mode().Overlap() == scoring.OverlapApprox {
		a.r.approx.Record(worker, hashes)
	}
}

var _ scoring.PrefixRecorder = approxRecorder{}

// The pool and its metrics are what the NATS adapters drive; bus declares
// them as interfaces so it does not import the scheduler.
var (
	_ bus.LoadSink    = (*scoring.Pool)(nil)
	_ bus.SyncPool    = (*scoring.Pool)(nil)
	_ bus.LoadSink    = reservingLoad{}
	_ bus.LoadMetrics = scoring.Metrics(nil)
	_ bus.SyncMetrics = scoring.Metrics(nil)
)

// startScheduler starts the scheduler's sweeper and the NATS adapters that
// feed its pool: load reports unless --engine-load scrape, replica sync
// when on. They stop when r.ctx ends;
// teardown waits for them through r.schedDone.
func (r *Server) startScheduler(s *scoring.Scheduler) error {
	sweep := make(chan struct{})
	go func() { defer close(sweep); s.Run(r.ctx) }()
	r.schedDone = append(r.schedDone, sweep)
	if r.cfg.EngineLoad != EngineLoadScrape {
		// Load comes over NATS; with scrape it comes from the engines
		// (engine/feed, server/kube.go) and no report is subscribed to.
		lr := bus.NewLoadReports(r.nc, r.cfg.Namespace, reservingLoad{s.Pool(), r.reserveIndex()}, s.Pool().Metrics())
		lr.SetLogger(r.log)
		if err := lr.Start(r.ctx); err != nil {
			return fmt.Errorf("load reports: %w", err)
		}
		r.schedDone = append(r.schedDone, lr.Done())
		r.loadReports = lr
	}
	if r.cfg.ReplicaSync {
		sy := bus.NewSync(r.nc, r.cfg.Namespace, r.cfg.RouterID, s.Pool(), s.Pool().Metrics())
		sy.SetHeartbeat(r.cfg.Recovery.SyncHeartbeat)
		sy.SetLogger(r.log)
		if err := sy.Start(r.ctx); err != nil {
			return fmt.Errorf("replica sync: %w", err)
		}
		r.schedDone = append(r.schedDone, sy.Done())
	}
	return nil
}

// SetMode switches the scheduler's mode in place (for A/B runs and
// /admin/mode). The pool and its live load, the admission queue, the load
// reports and replica sync carry on untouched; requests already waiting in
// the queue are picked by the new mode.
func (r *Server) SetMode(mode string) error {
	s := r.sched.Load()
	if err := s.SetMode(r.effectiveMode(mode)); err != nil {
		return err
	}
	r.log.Info("router mode switched", "mode", s.Mode().Name())
	return nil
}

// Reconfigure applies the routing options of o (mode, cost model and
// weights, queue limits: scoring.Scheduler.Reconfigure) to the running
// scheduler atomically, for a configuration reload. On error the options
// in use are kept.
func (r *Server) Reconfigure(o scoring.Options) error {
	s := r.sched.Load()
	o.Mode = r.effectiveMode(o.Mode)
	if err := s.Reconfigure(o); err != nil {
		return err
	}
	r.log.Info("routing options reloaded", "mode", s.Mode().Name(), "cost_model", s.Options().CostModel)
	return nil
}

// stopScheduler waits for the scheduler's background work; r.ctx must be
// cancelled.
func (r *Server) stopScheduler() {
	for _, d := range r.schedDone {
		<-d
	}
}
