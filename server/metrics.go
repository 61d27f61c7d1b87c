package server

import (
	"strconv"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/scoring"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/codes"
)

// Metrics is the router's Prometheus instrumentation (prefix kvroute_). It
// implements extproc.Metrics, picker.Metrics, kvevents.Metrics and
// scoring.Metrics.
type Metrics struct {
	requests      *prometheus.CounterVec
	phase         *prometheus.HistogramVec
	overlap       prometheus.Histogram
	cachedTokens  prometheus.Histogram
	byLoad        *prometheus.CounterVec
	finished      *prometheus.CounterVec
	routed        *prometheus.CounterVec
	queued        prometheus.Counter
	queueWait     prometheus.Histogram
	shed          *prometheus.CounterVec
	expired       prometheus.Counter
	firstToken    *prometheus.CounterVec
	hitsLost      prometheus.Counter
	hitsForecast  prometheus.Counter
	loadRejected  prometheus.Counter
	syncRejected  prometheus.Counter
	syncDropped   prometheus.Counter
	batches       *prometheus.CounterVec
	events        *prometheus.CounterVec
	blocks        *prometheus.CounterVec
	sequence      *prometheus.CounterVec
	streams       prometheus.Counter
	streamsActive prometheus.Gauge
	streamErrors  *prometheus.CounterVec
	immediate     *prometheus.CounterVec
	// exchanges by phase, then blocking (0: false, 1: true), resolved once:
	// every message from Envoy counts.
	exchanges       *prometheus.CounterVec
	exchangeByPhase map[string][2]prometheus.Counter
	streamExchanges prometheus.Histogram
	observations    *prometheus.CounterVec
	badRecords      *prometheus.CounterVec
	// unknownPublishers counts KV event batches on --engine-events-listen
	// whose topic names no single worker (no label: topics come from the
	// network and would be unbounded).
	unknownPublishers prometheus.Counter
	// engineBlockSize is the KV block size taken from a worker's engine
	// where it differs from the worker's record.
	engineBlockSize *prometheus.GaugeVec
	health          healthMetrics // metrics_health.go
	guard           guardMetrics
}

var (
	_ extproc.Metrics  = (*Metrics)(nil)
	_ picker.Metrics   = (*Metrics)(nil)
	_ scoring.Metrics  = (*Metrics)(nil)
	_ kvevents.Metrics = (*Metrics)(nil)
)

var latencyBuckets = []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1, 10}

func newMetrics(reg *prometheus.Registry, r *Server) *Metrics {
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_requests_total",
			Help: "Routing decisions by model, chosen worker, router mode and outcome (routed, no_worker, shed, overloaded, bad_body, cancelled, error)."},
			[]string{"model", "worker", "mode", "outcome"}),
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvroute_decision_duration_seconds",
			Help: "Time spent per decision phase: parse, tokenize, match, pick (pick includes admission-queue waits).", Buckets: latencyBuckets},
			[]string{"phase"}),
		overlap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_overlap_ratio",
			Help: "Share of the prompt's tokens already cached on the chosen worker.", Buckets: prometheus.LinearBuckets(0, 0.1, 11)}),
		cachedTokens: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_cached_tokens",
			Help: "Prompt tokens already cached on the chosen worker.", Buckets: prometheus.ExponentialBuckets(16, 4, 8)}),
		byLoad: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_routed_by_load_total",
			Help: "Requests routed without their prompt, by reason (no_tokenizer, not_json, no_body, other_path, too_many_messages, prompt_too_large, ...)."}, []string{"model", "reason"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_requests_finished_total",
			Help: "Routed requests whose load was freed, by outcome (ok, error_status, upstream_error: a 5xx the worker made or a connection it refused, local_reply: a 5xx the proxy made without the worker at fault, reset)."}, []string{"outcome"}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_scoring_routed_total",
			Help: "Requests admitted to a worker's pool by mode and worker."}, []string{"mode", "worker"}),
		queued: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_queue_entered_total", Help: "Requests that waited in the admission queue."}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_queue_wait_seconds",
			Help: "Time admitted requests waited in the admission queue.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 9)}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_queue_shed_total",
			Help: "Requests the admission queue refused (429), by reason."}, []string{"reason"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_requests_expired_total",
			Help: "Requests force-freed for exceeding the maximum request age."}),
		hitsLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_predicted_hit_tokens_lost_total",
			Help: "Prompt tokens a request was routed for as cached that its worker evicted before the request ran (seen in the worker's KV events); the request's prefill and the worker's backlog grew by them."}),
		hitsForecast: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_forecast_evicted_hit_tokens_total",
			Help: "Matched prompt tokens a decision did not count as cached on the chosen worker, because the eviction forecast expected the prefills queued ahead there to evict them before the request runs (--eviction-forecast)."}),
		firstToken: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_first_tokens_total",
			Help: "Routed requests whose prefill ended, by the signal that ended it: kv_event (the worker's BlockStored for the prompt's last block), response_body (the first response chunk), response_headers (the headers, with no body shown and no block awaited; untimed), event_gap (a gap in the worker's events after the response started; untimed)."}, []string{"signal"}),
		loadRejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_load_reports_rejected_total",
			Help: "Load reports that were malformed or named an unknown worker."}),
		syncRejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_sync_rejected_total", Help: "Replica sync messages that could not be applied."}),
		syncDropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_sync_dropped_total", Help: "Local lifecycle events not published to peers (buffer full)."}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_kv_event_batches_total",
			Help: "KV event batches received, by outcome (applied, decode_error, unknown_worker, duplicate, bad_subject)."}, []string{"outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_kv_events_total",
			Help: "KV events by type and outcome."}, []string{"type", "outcome"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_kv_blocks_total",
			Help: "KV blocks applied to the index, by operation (stored, removed, duplicate, off_device, unknown_removed)."}, []string{"op"}),
		sequence: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_kv_event_sequence_total",
			Help: "Notable KV event sequence changes per worker (gap, restart, fresh, missing, join)."}, []string{"worker", "event"}),
		streams:       prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_extproc_streams_total", Help: "ext_proc streams opened."}),
		streamsActive: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_extproc_streams_active", Help: "ext_proc streams open now."}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_extproc_stream_errors_total",
			Help: "ext_proc streams that ended with a gRPC error, by code (Envoy cancelling a stream when its exchange ends or its client leaves is a normal end)."}, []string{"code"}),
		exchanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_extproc_exchanges_total",
			Help: "Messages Envoy sent over ext_proc, by phase (request_headers, request_body, request_trailers, response_headers, response_body, response_trailers) and whether Envoy held the request for the answer (blocking=\"false\": observability mode)."},
			[]string{"phase", "blocking"}),
		streamExchanges: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_extproc_stream_blocking_exchanges",
			Help: "Messages per ext_proc stream (one HTTP request) that Envoy held the request for.", Buckets: []float64{0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 128}}),
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_extproc_observations_total",
			Help: "Response headers from the observing ext_proc filter, by whether they matched a request this process routed, directly or forwarded by a peer replica (matched=\"false\": another replica's request, forwarded to the peers; one routed without kvroute (fail-open); or a client-chosen request id used twice)."},
			[]string{"matched"}),
		immediate: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_extproc_immediate_responses_total",
			Help: "Immediate (error) responses sent to clients, by HTTP status."}, []string{"status"}),
		badRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_discovery_bad_records_total",
			Help: "Worker records ignored because they were invalid, by source (etcd, file, inferencepool)."}, []string{"source"}),
		unknownPublishers: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_engine_events_unknown_publisher_total",
			Help: "KV event batches received on --engine-events-listen whose topic names no single worker; dropped."}),
		engineBlockSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvroute_worker_engine_block_size",
			Help: "KV block size a worker's engine states in its events where it differs from the worker's record; the router routes with it."}, []string{"worker"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.phase, m.overlap, m.cachedTokens, m.byLoad, m.finished, m.routed, m.queued,
		m.queueWait, m.shed, m.expired, m.firstToken, m.hitsLost, m.hitsForecast, m.loadRejected, m.syncRejected, m.syncDropped, m.batches, m.events, m.blocks, m.sequence,
		m.streams, m.streamsActive, m.streamErrors, m.exchanges, m.streamExchanges, m.observations, m.immediate, m.badRecords, m.unknownPublishers, m.engineBlockSize, &stateCollector{r: r}} {
		f(c)
	}
	m.exchangeByPhase = map[string][2]prometheus.Counter{}
	for _, ph := range []string{extproc.ExchangeRequestHeaders, extproc.ExchangeRequestBody, extproc.ExchangeRequestTrailers,
		extproc.ExchangeResponseHeaders, extproc.ExchangeResponseBody, extproc.ExchangeResponseTrailers} {
		m.exchangeByPhase[ph] = [2]prometheus.Counter{m.exchanges.WithLabelValues(ph, "false"), m.exchanges.WithLabelValues(ph, "true")}
	}
	m.health.register(f)
	m.guard = newGuardMetrics(r)
	f(m.guard)
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// EngineBlockSize records the block size learned from a worker's engine;
// 0 drops the worker's series.
func (m *Metrics) EngineBlockSize(worker string, n int) {
	if n == 0 {
		m.engineBlockSize.DeleteLabelValues(worker)
		return
	}
	m.engineBlockSize.WithLabelValues(worker).Set(float64(n))
}

// extproc.Metrics

func (m *Metrics) StreamStarted() { m.streams.Inc(); m.streamsActive.Inc() }
func (m *Metrics) StreamEnded(code codes.Code) {
	m.streamsActive.Dec()
	if code != codes.OK {
		m.streamErrors.WithLabelValues(code.String()).Inc()
	}
}
func (m *Metrics) Rejected(status int) { m.immediate.WithLabelValues(strconv.Itoa(status)).Inc() }

// extproc.ExchangeMetrics

func (m *Metrics) Exchange(phase string, blocking bool) {
	b := 0
	if blocking {
		b = 1
	}
	if c, ok := m.exchangeByPhase[phase]; ok {
		c[b].Inc()
		return
	}
	m.exchanges.WithLabelValues(phase, strconv.FormatBool(blocking)).Inc()
}
func (m *Metrics) StreamExchanges(blocking int) { m.streamExchanges.Observe(float64(blocking)) }

// extproc.ObserveMetrics

func (m *Metrics) Observation(matched bool) {
	m.observations.WithLabelValues(strconv.FormatBool(matched)).Inc()
}

// picker.Metrics

func (m *Metrics) Decided(model, worker, mode, outcome string) {
	m.requests.WithLabelValues(model, worker, mode, outcome).Inc()
}
func (m *Metrics) Phase(phase string, d time.Duration) {
	m.phase.WithLabelValues(phase).Observe(d.Seconds())
}
func (m *Metrics) Overlap(ratio float64, cached int) {
	m.overlap.Observe(ratio)
	m.cachedTokens.Observe(float64(cached))
}
func (m *Metrics) ByLoad(model, reason string) { m.byLoad.WithLabelValues(model, reason).Inc() }
func (m *Metrics) Finished(o extproc.Outcome)  { m.finished.WithLabelValues(string(o)).Inc() }

// scoring.Metrics

func (m *Metrics) Routed(mode, worker string)  { m.routed.WithLabelValues(mode, worker).Inc() }
func (m *Metrics) Queued()                     { m.queued.Inc() }
func (m *Metrics) Dequeued(wait time.Duration) { m.queueWait.Observe(wait.Seconds()) }
func (m *Metrics) Shed(reason string)          { m.shed.WithLabelValues(reason).Inc() }
func (m *Metrics) Expired(n int)               { m.expired.Add(float64(n)) }

// FirstToken implements scoring.Metrics.
func (m *Metrics) FirstToken(signal string) { m.firstToken.WithLabelValues(signal).Inc() }

// HitLost implements scoring.Metrics.
func (m *Metrics) HitLost(tokens int) { m.hitsLost.Add(float64(tokens)) }

// HitForecastLost implements scoring.Metrics.
func (m *Metrics) HitForecastLost(tokens int) { m.hitsForecast.Add(float64(tokens)) }
func (m *Metrics) LoadReportRejected()        { m.loadRejected.Inc() }
func (m *Metrics) SyncRejected()              { m.syncRejected.Inc() }
func (m *Metrics) SyncDropped()               { m.syncDropped.Inc() }

// kvevents.Metrics

func (m *Metrics) Batch(worker string, o kvevents.BatchOutcome) {
	m.batches.WithLabelValues(string(o)).Inc()
}
func (m *Metrics) Sequence(worker string, ev kvevents.SeqEvent) {
	m.sequence.WithLabelValues(worker, string(ev)).Inc()
}
func (m *Metrics) Applied(worker string, s kvindex.ApplyStats) {
	add := func(v *prometheus.CounterVec, n int, labels ...string) {
		if n > 0 {
			v.WithLabelValues(labels...).Add(float64(n))
		}
	}
	add(m.events, s.StoredEvents, "BlockStored", "applied")
	add(m.events, s.UnknownParent, "BlockStored", "unknown_parent")
	add(m.events, s.BlockSizeMismatch, "BlockStored", "block_size_mismatch")
	add(m.events, s.Malformed, "BlockStored", "malformed")
	add(m.events, s.IgnoredGroup, "other", "ignored_group")
	add(m.events, s.RemovedEvents, "BlockRemoved", "applied")
	add(m.events, s.Cleared, "AllBlocksCleared", "applied")
	add(m.blocks, s.StoredBlocks, "stored")
	add(m.blocks, s.RemovedBlocks, "removed")
	add(m.blocks, s.DuplicateBlocks, "duplicate")
	add(m.blocks, s.OffDeviceBlocks, "off_device")
	add(m.blocks, s.UnknownRemoved, "unknown_removed")
}

// stateCollector reports gauges read from the index and the pool at
// scrape time.
type stateCollector struct{ r *Server }

var (
	descEntries  = prometheus.NewDesc("kvroute_index_entries", "(block, worker) pairs in the KV index (device tier).", nil, nil)
	descBlocks   = prometheus.NewDesc("kvroute_index_blocks", "Distinct block rows in the KV index.", nil, nil)
	descBytes    = prometheus.NewDesc("kvroute_index_bytes", "Approximate memory of the KV index.", nil, nil)
	descApprox   = prometheus.NewDesc("kvroute_approx_index_entries", "(block, worker) pairs in the approximate index.", nil, nil)
	descWorkers  = prometheus.NewDesc("kvroute_workers", "Workers by state (ready, stale: KV event view needs a resync).", []string{"state"}, nil)
	descActive   = prometheus.NewDesc("kvroute_worker_active_requests", "Requests in flight per worker.", []string{"worker"}, nil)
	descActBlk   = prometheus.NewDesc("kvroute_worker_active_blocks", "KV blocks of the requests in flight per worker.", []string{"worker"}, nil)
	descPrefill  = prometheus.NewDesc("kvroute_worker_prefill_tokens", "Uncached prompt tokens in prefill per worker.", []string{"worker"}, nil)
	descRate     = prometheus.NewDesc("kvroute_worker_prefill_rate_tokens_per_second", "Prefill speed the router learned for the worker from its times to first token.", []string{"worker"}, nil)
	descOverhead = prometheus.NewDesc("kvroute_worker_prefill_overhead_seconds", "Fixed part of the worker's time to first token, as learned.", []string{"worker"}, nil)
	descBacklog  = prometheus.NewDesc("kvroute_worker_prefill_backlog_tokens", "Modelled prefill work still ahead on the worker: tokens in flight drained at the learned rate.", []string{"worker"}, nil)
	descContext  = prometheus.NewDesc("kvroute_worker_prefill_context_seconds", "Cost of one prompt token attending to one cached or earlier token on the worker, as learned: what cached context adds to a prefill.", []string{"worker"}, nil)
	descPass     = prometheus.NewDesc("kvroute_worker_prefill_shared_pass_seconds", "Extra time of each prefill pass run beside other active requests on the worker, as learned: what sharing the engine adds beyond the KV the decodes read.", []string{"worker"}, nil)
	descChurn    = prometheus.NewDesc("kvroute_worker_cache_churn_tokens", "Uncached prompt tokens routed to the worker lately, halved every minute: how fast its cache turns over.", []string{"worker"}, nil)
	descQueue    = prometheus.NewDesc("kvroute_queue_depth", "Requests waiting in the admission queue.", nil, nil)
	descEvQueue  = prometheus.NewDesc("kvroute_kv_event_queue_depth", "KV event batches waiting to be applied to the index; when full, the NATS subscription drops batches (gaps) and the other transports wait.", nil, nil)
	descMode     = prometheus.NewDesc("kvroute_router_mode", "The router mode in use (value 1).", []string{"mode"}, nil)
	descReadyDsc = prometheus.NewDesc("kvroute_ready", "1 when the router is ready to route.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEntries, descBlocks, descBytes, descApprox, descWorkers, descActive, descActBlk, descPrefill, descRate, descOverhead, descBacklog, descContext, descPass, descChurn, descQueue, descEvQueue, descMode, descReadyDsc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	st := r.index.Stats()
	ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(st.Blocks))
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(descApprox, prometheus.GaugeValue, float64(r.approx.Len()))
	if r.events != nil {
		ch <- prometheus.MustNewConstMetric(descEvQueue, prometheus.GaugeValue, float64(r.events.Queued()))
	}
	stale := 0
	for _, w := range st.PerWorker {
		if w.Stale {
			stale++
		}
	}
	n := r.fleet.len()
	ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(n-stale), "ready")
	ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(stale), "stale")
	sched := r.sched.Load()
	if sched == nil {
		return
	}
	for _, l := range sched.Pool().Snapshot() {
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(l.ActiveRequests), l.ID)
		ch <- prometheus.MustNewConstMetric(descActBlk, prometheus.GaugeValue, float64(l.ActiveBlocks), l.ID)
		ch <- prometheus.MustNewConstMetric(descPrefill, prometheus.GaugeValue, float64(l.PrefillTokens), l.ID)
		ch <- prometheus.MustNewConstMetric(descRate, prometheus.GaugeValue, l.PrefillRate, l.ID)
		ch <- prometheus.MustNewConstMetric(descOverhead, prometheus.GaugeValue, l.PrefillOverhead, l.ID)
		ch <- prometheus.MustNewConstMetric(descBacklog, prometheus.GaugeValue, l.PrefillBacklog, l.ID)
		ch <- prometheus.MustNewConstMetric(descContext, prometheus.GaugeValue, l.PrefillContext, l.ID)
		ch <- prometheus.MustNewConstMetric(descPass, prometheus.GaugeValue, l.PrefillPass, l.ID)
		ch <- prometheus.MustNewConstMetric(descChurn, prometheus.GaugeValue, l.Churn, l.ID)
	}
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(sched.QueueLen()))
	ch <- prometheus.MustNewConstMetric(descMode, prometheus.GaugeValue, 1, sched.Mode().Name())
	ready := 0.0
	if r.Ready() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReadyDsc, prometheus.GaugeValue, ready)
}
