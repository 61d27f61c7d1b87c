package scoring

import (
	"strings"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// Passive health: the pool learns from how routed requests end that a
// worker is failing (connection refused, reset before the response, 5xx)
// and ejects it for a back-off period, as Envoy's outlier detection does,
// because a dead worker's load drops to zero and would otherwise make it
// the least loaded choice until its lease lapses.

// Defaults of the passive health options.
const (
	DefaultEjectAfter      = 2
	DefaultEjectBackoff    = 2 * time.Second
	DefaultEjectBackoffMax = 60 * time.Second
)

// health is one worker's passive health state. Guarded by Pool.mu.
type health struct {
	// ejectedUntil is when the current ejection ends (zero: not ejected).
	ejectedUntil time.Time
	// coolUntil is when the worker stops being passed over after the
	// proxy answered for it (local_reply.go); zero: not cooling.
	coolUntil time.Time
	// failures counts consecutive failed requests; a success resets it.
	failures int
	// ejections counts ejections since the last success; each doubles the
	// back-off.
	ejections int
	// reason is the last failure's, for the ejection report.
	reason string
}

// Ejection is what the pool reports when passive health ejects a worker.
type Ejection struct {
	Worker string
	// Reason is the last failure's cause, as the caller of ObserveFailure
	// named it.
	Reason string
	// Failures is the consecutive failures that ejected it; Ejections the
	// ejections in a row without a success (each doubles Backoff).
	Failures, Ejections int
	// Backoff is how long it is out; Until is when it is back.
	Backoff time.Duration
	Until   time.Time
}

// HealthObserver hears of passive health ejections. A Metrics (Options.
// Metrics) that also implements it is told of each one, after the pool's
// lock is released; the router logs them. It must not call back into the
// pool synchronously.
type HealthObserver interface {
	WorkerEjected(Ejection)
}

// tier orders candidates for a pick: the pick only considers the best tier
// present, so an ejected worker is used only when every candidate is
// ejected (fail open) and a worker whose load reports stopped only when no
// reporting one is left.
type tier uint8

const (
	tierHealthy tier = iota
	tierCooling      // the proxy answered for it a moment ago (local_reply.go)
	tierSilent       // load reports stopped: probably dead or cut off
	tierEjected      // passive health ejected it
)

func (l *Load) tier() tier {
	switch {
	case l.Ejected:
		return tierEjected
	case l.ReportSilent:
		return tierSilent
	case l.Cooling:
		return tierCooling
	}
	return tierHealthy
}

// keepBestTier drops the loads worse than the best tier present, in place,
// and returns the shortened slice.
func keepBestTier(loads []Load) []Load {
	best, worst := tierEjected, tierHealthy
	for i := range loads {
		t := loads[i].tier()
		best, worst = min(best, t), max(worst, t)
	}
	if best == worst {
		// The common case: nothing to drop. A Load is a few hundred
		// bytes, and copying each onto itself was about 15 % of a
		// 1,000-worker decision (BenchmarkPick).
		return loads
	}
	n := 0
	for i := range loads {
		if loads[i].tier() == best {
			loads[n] = loads[i]
			n++
		}
	}
	return loads[:n]
}

// Observe records how a request on worker ended: ok false for a failure
// the worker is to blame for (a 5xx, a connect failure, a reset before the
// response). After Options.EjectAfter consecutive failures the worker is
// ejected for Options.EjectBackoff, doubled on each ejection without a
// success in between and capped at Options.EjectBackoffMax; the requests
// in flight on it are freed, since a dead worker will never end them.
// Unknown workers are ignored. It reports whether the worker was ejected.
func (p *Pool) Observe(worker string, ok bool) bool {
	return p.observe(worker, ok, "request failed")
}

// ObserveFailure is Observe(worker, false) with the failure's cause, which
// an ejection report (HealthObserver) carries.
func (p *Pool) ObserveFailure(worker, reason string) bool {
	return p.observe(worker, false, reason)
}

func (p *Pool) observe(worker string, ok bool, reason string) bool {
	if p.opts.EjectAfter < 0 {
		return false
	}
	if ok {
		// The common case, a success on a worker with a clean record, needs
		// no write lock on the request path.
		p.mu.RLock()
		w, known := p.workers[worker]
		clean := !known || (w.health.failures == 0 && w.health.ejections == 0)
		p.mu.RUnlock()
		if clean {
			return false
		}
	}
	now := p.opts.Now()
	var freed []string
	p.mu.Lock()
	w, known := p.workers[worker]
	if !known {
		p.mu.Unlock()
		return false
	}
	h := &w.health
	if ok {
		h.failures, h.ejections = 0, 0
		p.mu.Unlock()
		return false
	}
	h.failures++
	h.reason = reason
	if h.failures < p.opts.EjectAfter {
		p.mu.Unlock()
		return false
	}
	backoff := p.opts.EjectBackoff << min(h.ejections, 20)
	if backoff <= 0 || backoff > p.opts.EjectBackoffMax {
		backoff = p.opts.EjectBackoffMax
	}
	ej := Ejection{Worker: worker, Reason: h.reason, Failures: h.failures, Ejections: h.ejections + 1, Backoff: backoff, Until: now.Add(backoff)}
	h.failures = 0
	h.ejections++
	h.ejectedUntil = ej.Until
	w.pending.reset() // an ejected worker's pending blocks may never be computed
	for key, a := range p.reqs {
		if a.w != w {
			continue
		}
		p.releaseLocked(a)
		delete(p.reqs, key)
		p.tomb.add(key)
		if !strings.Contains(key, "\x00") {
			freed = append(freed, key)
		}
	}
	p.summarizeLocked(w)
	p.mu.Unlock()
	for _, key := range freed {
		p.emit(fleet.SyncEvent{Op: fleet.OpFree, ID: key})
	}
	p.opts.Metrics.Ejected(worker)
	if o, ok := p.opts.Metrics.(HealthObserver); ok {
		o.WorkerEjected(ej)
	}
	p.capacityChanged()
	return true
}

// Ejected reports whether a worker is ejected now, and until when.
func (p *Pool) Ejected(worker string) (time.Time, bool) {
	now := p.opts.Now()
	p.mu.RLock()
	defer p.mu.RUnlock()
	w, ok := p.workers[worker]
	if !ok || !w.health.ejectedUntil.After(now) {
		return time.Time{}, false
	}
	return w.health.ejectedUntil, true
}
