package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/fleet"
)

// resyncTimeout bounds one resync request's wait for the publisher.
const resyncTimeout = 2 * time.Second

// runResync asks stale workers' publishers to resync (bus.ResyncSubject),
// each at most once per Recovery.ResyncInterval while it stays stale, until
// the router stops. A worker clears its staleness when the re-announcement
// (AllBlocksCleared first) or a fresh stream arrives; until then the picker
// gives it no overlap credit.
func (r *Server) runResync() {
	every := r.cfg.Recovery.ResyncInterval
	tick := time.NewTicker(min(every, 500*time.Millisecond))
	defer tick.Stop()
	asked := map[string]time.Time{}
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		for _, w := range r.index.Stats().PerWorker {
			if !w.Stale {
				delete(asked, w.ID)
				continue
			}
			if t, ok := asked[w.ID]; ok && now.Sub(t) < every {
				continue
			}
			asked[w.ID] = now
			go r.requestResync(w.ID, "stale")
		}
	}
}

// requestResync asks worker's publisher to re-announce its cache; reason
// is "stale" (its view has a hole) or "cold_start" (the router starts with
// an empty index).
func (r *Server) requestResync(worker, reason string) {
	ctx, cancel := context.WithTimeout(r.ctx, resyncTimeout)
	defer cancel()
	err := bus.RequestResync(ctx, r.nc, r.cfg.Namespace, worker, bus.ResyncRequest{Router: r.cfg.RouterID, Reason: reason})
	outcome := "ok"
	switch {
	case err == nil:
		r.log.Info("asked a worker to resync its KV events", "worker", worker, "reason", reason)
	case errors.Is(err, bus.ErrNoResponder):
		outcome = "no_responder"
		r.log.Debug("worker has no resync responder", "worker", worker, "reason", reason)
	case r.ctx.Err() != nil:
		return
	default:
		outcome = "error"
		r.log.Warn("resync request failed", "worker", worker, "err", err)
	}
	r.metrics.health.resyncs.WithLabelValues(worker, outcome).Inc()
}

// coldResync asks each worker a cold-started router learns of (no
// --warm-from, no --durable-events: its index starts empty) to re-announce
// its cache, once, so the router does not wait for new traffic to learn
// what every worker already holds. The worker's view is not marked stale
// meanwhile: its live events apply as they come, and a worker that
// cannot replay loses nothing.
type coldResync struct {
	r *Server

	mu    sync.Mutex
	asked map[string]bool
}

func (c *coldResync) Upsert(spec fleet.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.asked[spec.ID] {
		return
	}
	c.asked[spec.ID] = true
	go c.r.requestResync(spec.ID, "cold_start")
}

func (c *coldResync) Remove(string) {}

var _ fleet.Sink = (*coldResync)(nil)
