package server

import (
	"fmt"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/kvevents"
)

// newEventCore returns the KV event core every transport delivers to
// (docs/architecture.md §1), or nil without KV events. A warm start holds
// it (hold) until the snapshot is loaded and seeded; meanwhile deliveries
// queue.
func (r *Server) newEventCore(hold chan struct{}) *kvevents.Core {
	if !r.cfg.KVEvents {
		return nil
	}
	cfg := kvevents.Config{Index: r.index, Metrics: r.metrics, Logger: r.log, BlockSize: r.fleet.learnBlockSize}
	if hold != nil {
		cfg.Hold, cfg.Buffer = hold, 1<<16
	}
	return kvevents.New(cfg)
}

// eventsOverNATS reports whether KV events come over NATS (core
// subscription or the durable stream) rather than from the engines' ZMQ
// sockets.
func (r *Server) eventsOverNATS() bool {
	return r.events != nil && r.cfg.EngineEvents != EngineEventsZMQ
}

// startEvents starts the core and its transport. Over NATS it subscribes
// now (a warm start's hold keeps what arrives queued), except with durable
// events: the stream keeps what arrives meanwhile, and the core and its
// stream consumer start after discovery and the snapshot (durableRecover).
// With ZMQ the engine feeds deliver as discovery adds workers.
func (r *Server) startEvents() error {
	if r.events == nil {
		return nil
	}
	if r.cfg.Recovery.DurableEvents {
		return r.setupDurable()
	}
	if err := r.events.Start(r.ctx); err != nil {
		return fmt.Errorf("kv events: %w", err)
	}
	if !r.eventsOverNATS() {
		return nil
	}
	if err := bus.SubscribeEvents(r.ctx, r.nc, r.cfg.Namespace, r.events); err != nil {
		return fmt.Errorf("kv events: %w", err)
	}
	return nil
}
