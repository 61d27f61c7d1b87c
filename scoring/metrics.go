package scoring

import "time"

// Metrics receives the package's counters. The binary wires them to
// Prometheus; scoring itself imports no metrics library. Implementations
// must be safe for concurrent use and cheap: they are called on the request
// path. Embed NopMetrics to implement only some of them.
type Metrics interface {
	// Routed counts a routing decision by mode and chosen worker.
	Routed(mode, worker string)
	// Queued counts a request that entered the admission queue.
	Queued()
	// Dequeued records how long an admitted waiter waited.
	Dequeued(wait time.Duration)
	// Shed counts a request the queue refused; reason is "queue_full" or
	// "max_wait".
	Shed(reason string)
	// Expired counts requests force-freed for exceeding the maximum age.
	Expired(n int)
	// LoadReportRejected counts load reports that were malformed or named
	// an unknown worker.
	LoadReportRejected()
	// SyncRejected counts replica sync messages that could not be decoded.
	SyncRejected()
	// SyncDropped counts local events not published because the outgoing
	// buffer was full.
	SyncDropped()
	// Ejected counts a worker ejected by passive health.
	Ejected(worker string)
	// PeerExpired counts a peer replica whose load was dropped because its
	// heartbeats stopped.
	PeerExpired()
	// FirstToken counts a local request's prefill ended, by the signal
	// that ended it (FirstTokenKVEvent, FirstTokenResponse, ...).
	FirstToken(signal string)
	// HitLost counts prompt tokens a local request was sent for as cached
	// that its worker evicted before the request ran (lost_hits.go).
	HitLost(tokens int)
	// HitForecastLost counts matched prompt tokens a decision did not
	// count as cached on the chosen worker: the eviction forecast expected
	// the prefills queued ahead there to evict them first (forecast.go).
	HitForecastLost(tokens int)
}

// NopMetrics discards every counter. Embed it to implement part of Metrics.
type NopMetrics struct{}

var _ Metrics = NopMetrics{}

// Routed implements Metrics.
func (NopMetrics) Routed(string, string) {}

// Queued implements Metrics.
func (NopMetrics) Queued() {}

// Dequeued implements Metrics.
func (NopMetrics) Dequeued(time.Duration) {}

// Shed implements Metrics.
func (NopMetrics) Shed(string) {}

// Expired implements Metrics.
func (NopMetrics) Expired(int) {}

// LoadReportRejected implements Metrics.
func (NopMetrics) LoadReportRejected() {}

// SyncRejected implements Metrics.
func (NopMetrics) SyncRejected() {}

// SyncDropped implements Metrics.
func (NopMetrics) SyncDropped() {}

// Ejected implements Metrics.
func (NopMetrics) Ejected(string) {}

// PeerExpired implements Metrics.
func (NopMetrics) PeerExpired() {}

// FirstToken implements Metrics.
func (NopMetrics) FirstToken(string) {}

// HitLost implements Metrics.
func (NopMetrics) HitLost(int) {}

// HitForecastLost implements Metrics.
func (NopMetrics) HitForecastLost(int) {}
