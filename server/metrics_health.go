package server

import "github.com/prometheus/client_golang/prometheus"

// healthMetrics count the failure handling: passive health
// ejections, peers dropped for silence, index resyncs and warm starts.
type healthMetrics struct {
	ejected     *prometheus.CounterVec
	peerExpired prometheus.Counter
	resyncs     *prometheus.CounterVec
	warmSeconds prometheus.Gauge
	warmEntries prometheus.Gauge

	// --durable-events
	recoverySeconds, recoveryEntries, recoveryReplayed prometheus.Gauge
	agedOut                                            prometheus.Counter
	snapshotErrors                                     *prometheus.CounterVec
	snapshotLastError, snapshotBytes, snapshotTime     prometheus.Gauge
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
	h.recoverySeconds = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_recovery_seconds",
		Help: "--durable-events: how long recovering the index at start took (object store snapshot load plus stream replay)."})
	h.recoveryEntries = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_recovery_entries",
		Help: "--durable-events: index entries held when the recovery at start finished."})
	h.recoveryReplayed = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_recovery_replayed_messages",
		Help: "--durable-events: stream messages replayed after the snapshot during the recovery at start."})
	h.agedOut = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_kv_events_aged_out_total",
		Help: "--durable-events: KV event messages discarded from the stream (age or size limit) before this replica applied them; every worker is then stale until it resyncs."})
	h.snapshotErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_index_snapshot_errors_total",
		Help: "--durable-events: index snapshots that failed, by operation (write, load)."}, []string{"op"})
	h.snapshotLastError = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_snapshot_last_failed",
		Help: "--durable-events: 1 when the last index snapshot write failed, else 0."})
	h.snapshotBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_snapshot_bytes",
		Help: "--durable-events: size of the last index snapshot this replica stored."})
	h.snapshotTime = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_index_snapshot_timestamp_seconds",
		Help: "--durable-events: Unix time of the last index snapshot this replica stored (age: time() minus this)."})
	for _, c := range []prometheus.Collector{h.ejected, h.peerExpired, h.resyncs, h.warmSeconds, h.warmEntries,
		h.recoverySeconds, h.recoveryEntries, h.recoveryReplayed, h.agedOut, h.snapshotErrors, h.snapshotLastError, h.snapshotBytes, h.snapshotTime} {
		f(c)
	}
}

// Ejected implements scoring.Metrics.
func (m *Metrics) Ejected(worker string) { m.health.ejected.WithLabelValues(worker).Inc() }

// PeerExpired implements scoring.Metrics.
func (m *Metrics) PeerExpired() { m.health.peerExpired.Inc() }
