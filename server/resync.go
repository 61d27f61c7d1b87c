package server

import (
	"context"
	"errors"
	"time"

	"github.com/kvroute/kvroute/bus"
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
			go r.requestResync(w.ID)
		}
	}
}

func (r *Server) requestResync(worker string) {
	ctx, cancel := context.WithTimeout(r.ctx, resyncTimeout)
	defer cancel()
	err := bus.RequestResync(ctx, r.nc, r.cfg.Namespace, worker, bus.ResyncRequest{Router: r.cfg.RouterID, Reason: "stale"})
	outcome := "ok"
	switch {
	case err == nil:
		r.log.Info("asked a stale worker to resync", "worker", worker)
	case errors.Is(err, bus.ErrNoResponder):
		outcome = "no_responder"
		r.log.Debug("stale worker has no resync responder", "worker", worker)
	case r.ctx.Err() != nil:
		return
	default:
		outcome = "error"
		r.log.Warn("resync request failed", "worker", worker, "err", err)
	}
	r.metrics.health.resyncs.WithLabelValues(worker, outcome).Inc()
}
