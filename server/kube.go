package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/engine/feed"
)

// Values of Config.EngineEvents and Config.EngineLoad.
const (
	EngineEventsNATS = "nats"
	EngineEventsZMQ  = "zmq"
	EngineLoadNATS   = "nats"
	EngineLoadScrape = "scrape"
)

// validateDiscovery checks that exactly one worker source is chosen and
// that the engine feed settings make sense.
func (c *Config) validateDiscovery() []error {
	var errs []error
	var sources []string
	if len(c.EtcdEndpoints) > 0 {
		sources = append(sources, "etcd endpoints")
	}
	if c.WorkersFile != "" {
		sources = append(sources, "a workers file")
	}
	if c.PoolName != "" {
		sources = append(sources, "an InferencePool")
	}
	switch len(sources) {
	case 0:
		errs = append(errs, errors.New("no worker discovery: give etcd endpoints, a workers file or an InferencePool name"))
	case 1:
	default:
		errs = append(errs, fmt.Errorf("worker discovery sources are exclusive, got %v: give one of etcd endpoints, a workers file or an InferencePool name", sources))
	}
	switch c.EngineEvents {
	case "", EngineEventsNATS, EngineEventsZMQ:
	default:
		errs = append(errs, fmt.Errorf("engine events %q: want nats or zmq", c.EngineEvents))
	}
	switch c.EngineLoad {
	case "", EngineLoadNATS, EngineLoadScrape:
	default:
		errs = append(errs, fmt.Errorf("engine load %q: want nats or scrape", c.EngineLoad))
	}
	if c.Engine != "" {
		if _, err := engine.ParseEngine(c.Engine); err != nil {
			errs = append(errs, err)
		}
	}
	if c.EngineEventsListen != "" && c.EngineEvents != EngineEventsZMQ {
		errs = append(errs, errors.New("--engine-events-listen needs --engine-events zmq"))
	}
	if c.EngineEventsPort < 0 || c.EngineEventsPort > 65535 || c.EngineReplayPort > 65535 {
		errs = append(errs, fmt.Errorf("engine events port %d or replay port %d out of range", c.EngineEventsPort, c.EngineReplayPort))
	}
	return errs
}

// needsNATS reports whether anything of this configuration goes over NATS:
// KV events or load reports not taken from the engines directly, replica
// sync, or a NATS server given explicitly. Without it no NATS server is
// embedded and readiness does not wait for one.
func (c *Config) needsNATS() bool {
	return c.NATSURL != "" || c.ReplicaSync ||
		(c.KVEvents && c.EngineEvents != EngineEventsZMQ) || c.EngineLoad != EngineLoadScrape
}

// newEngineFeeds returns the fleet listener that follows every worker's
// engine itself, or nil when neither events nor load come from engines.
func (r *Server) newEngineFeeds(hold <-chan struct{}) (*feed.Feeds, error) {
	events := r.cfg.KVEvents && r.cfg.EngineEvents == EngineEventsZMQ
	load := r.cfg.EngineLoad == EngineLoadScrape
	if !events && !load {
		return nil, nil
	}
	return feed.New(feed.Config{
		Events: events, EventsPort: r.cfg.EngineEventsPort, ReplayPort: r.cfg.EngineReplayPort, Topic: r.cfg.EngineEventsTopic,
		Listen: r.cfg.EngineEventsListen, OnUnknownPublisher: r.metrics.unknownPublishers.Inc,
		Load: load, Engine: engine.Engine(r.cfg.Engine),
		Core: r.events, Hold: hold, Pool: r.sched.Load().Pool(), Logger: r.log,
	})
}

// startPoolDiscovery watches the InferencePool and waits (10 s at most)
// for the first full list, as etcd discovery does.
func (r *Server) startPoolDiscovery() error {
	rest, err := kubepool.RESTConfig(r.cfg.Kubeconfig)
	if err != nil {
		return err
	}
	ns := r.cfg.PoolNamespace
	if ns == "" {
		ns = "default"
	}
	w, err := kubepool.New(kubepool.Config{
		PoolName: r.cfg.PoolName, PoolNamespace: ns, REST: rest, Defaults: r.cfg.PoolDefaults, Sink: r.fleet,
		OnBadPod: func(string, error) { r.metrics.badRecords.WithLabelValues("inferencepool").Inc() },
		OnHealth: func(err error) {
			if err != nil {
				r.dependencyDown(depKube, err)
			} else {
				r.dependencyUp(depKube)
			}
		},
		Logger: r.log,
	})
	if err != nil {
		return err
	}
	start := time.Now()
	r.goRun(func() error { _ = w.Run(r.ctx); return nil })
	go func() {
		select {
		case <-w.Synced():
			r.synced.Store(true) // readiness: discovery synced
		case <-r.ctx.Done():
		}
	}()
	select {
	case <-w.Synced():
		r.log.Info("inferencepool synced", "pool", ns+"/"+r.cfg.PoolName, "workers", r.fleet.len(), "took", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		r.log.Warn("inferencepool not synced after 10s; serving without workers until it is", "pool", ns+"/"+r.cfg.PoolName)
	}
	return nil
}

// EngineFeeds exposes the engine followers (nil unless --engine-events zmq
// or --engine-load scrape).
func (r *Server) EngineFeeds() *feed.Feeds { return r.feeds }
