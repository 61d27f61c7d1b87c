package server

import "github.com/prometheus/client_golang/prometheus"

// healthMetrics count the failure handling of issue 13: passive health
// ejections, peers dropped for silence, index resyncs and warm starts.
type healthMetrics struct {
	ejected     *prometheus.CounterVec
	peerExpired prometheus.Counter
	resyncs     *prometheus.CounterVec
	warmSeconds prometheus.Gauge
	warmEntries prometheus.Gauge
}

func (h *healthMetrics) register(f func(prometheus.Collector)) {
	h.ejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_worker_ejections_total",
		Help: "Workers ejected by passive health after consecutive failed requests (5xx, connect failures, resets before the response)."}, []string{"worker"})
	h.peerExpired = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_sync_peers_expired_total",
		Help: "Peer replicas whose in-flight load was dropped because their heartbeats stopped."})
	h.resyncs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_kv_resync_requests_total",
		Help: "Resync requests sent to stale workers' publishers, by outcome (ok, no_responder, error)."}, []string{"worker", "outcome"})
	h.warmSeconds = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_warm_start_seconds",
		Help: "How long loading a peer's index snapshot took at start (0: cold start)."})
	h.warmEntries = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_warm_start_entries",
		Help: "Index entries loaded from a peer's snapshot at start."})
	for _, c := range []prometheus.Collector{h.ejected, h.peerExpired, h.resyncs, h.warmSeconds, h.warmEntries} {
		f(c)
	}
}

// Ejected implements scoring.Metrics.
func (m *Metrics) Ejected(worker string) { m.health.ejected.WithLabelValues(worker).Inc() }

// PeerExpired implements scoring.Metrics.
func (m *Metrics) PeerExpired() { m.health.peerExpired.Inc() }
