package server

import (
	"errors"
	"fmt"

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

// validateEngineFeed checks that the engine feed settings make sense.
func (c *Config) validateEngineFeed() []error {
	var errs []error
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
		Core: r.events, Hold: hold, Pool: reservingLoad{r.sched.Load().Pool(), r.reserveIndex()}, Logger: r.log,
		BlockSize: r.fleet.learnBlockSize,
	})
}

// EngineFeeds exposes the engine followers (nil unless --engine-events zmq
// or --engine-load scrape).
func (r *Server) EngineFeeds() *feed.Feeds { return r.feeds }
