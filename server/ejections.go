package server

import (
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// ejectionLog is the scheduler's Metrics with scoring.HealthObserver added:
// one log line when passive health ejects a worker and one when the
// ejection ends, so an operator sees which worker, why and for how long,
// not only kvroute_worker_ejections_total moving.
type ejectionLog struct {
	*Metrics
	r *Server
}

var _ scoring.HealthObserver = ejectionLog{}

// WorkerEjected implements scoring.HealthObserver. It is called on the
// request path, after the pool's lock is released.
func (l ejectionLog) WorkerEjected(e scoring.Ejection) {
	l.r.log.Warn("worker ejected by passive health", "worker", e.Worker, "reason", e.Reason,
		"failures", e.Failures, "ejections_in_a_row", e.Ejections, "for", e.Backoff, "until", e.Until.Format(time.RFC3339Nano))
	time.AfterFunc(e.Backoff, func() {
		if l.r.ctx.Err() != nil {
			return
		}
		if _, still := l.r.sched.Load().Pool().Ejected(e.Worker); still {
			return // ejected again meanwhile: that ejection's timer reports
		}
		l.r.log.Info("worker back from ejection: eligible for routing again", "worker", e.Worker, "was_out_for", e.Backoff)
	})
}
