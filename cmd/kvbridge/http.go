package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/bridge"
	"github.com/kvroute/kvroute/engine"
)

// statusHandler serves the sidecar's own probes and counters:
// /healthz (the process runs), /readyz (the worker is registered, or
// registration is off and the engine answered), /metrics (kvbridge_*).
func statusHandler(b *bridge.Bridge) http.Handler {
	reg := prometheus.NewRegistry()
	counters := []struct {
		name, help string
		get        func(engine.StatsSnapshot) int64
	}{
		{"kvbridge_batches_received_total", "KV event batches received live from the engine.", func(s engine.StatsSnapshot) int64 { return s.Received }},
		{"kvbridge_batches_forwarded_total", "KV event batches republished on NATS (live or replayed).", func(s engine.StatsSnapshot) int64 { return s.Forwarded }},
		{"kvbridge_batches_replayed_total", "Batches republished after fetching them from the engine's replay socket.", func(s engine.StatsSnapshot) int64 { return s.Replayed }},
		{"kvbridge_batches_duplicate_total", "Live batches dropped because replay had already republished them.", func(s engine.StatsSnapshot) int64 { return s.Duplicates }},
		{"kvbridge_gaps_healed_total", "Sequence gaps filled completely by replay.", func(s engine.StatsSnapshot) int64 { return s.Heals }},
		{"kvbridge_gaps_unhealed_total", "Sequence gaps replay could not fill (AllBlocksCleared sent).", func(s engine.StatsSnapshot) int64 { return s.HealFailures }},
		{"kvbridge_stream_resets_total", "Stream restarts: bridge start, engine restart, lost connection.", func(s engine.StatsSnapshot) int64 { return s.Resets }},
		{"kvbridge_clears_published_total", "Synthetic AllBlocksCleared batches published.", func(s engine.StatsSnapshot) int64 { return s.Clears }},
		{"kvbridge_malformed_messages_total", "ZMQ messages not in vLLM's frame layout.", func(s engine.StatsSnapshot) int64 { return s.Malformed }},
		{"kvbridge_bad_rank_batches_total", "Batches dropped for a data-parallel rank outside --data-parallel-size.", func(s engine.StatsSnapshot) int64 { return s.BadRank }},
		{"kvbridge_publish_errors_total", "NATS publish failures.", func(s engine.StatsSnapshot) int64 { return s.PublishErrors }},
		{"kvbridge_unknown_publisher_batches_total", "Batches dropped on --engine-events-listen from a publisher whose topic names another engine.", func(s engine.StatsSnapshot) int64 { return s.UnknownPublisher }},
		{"kvbridge_load_reports_total", "Load reports published.", func(s engine.StatsSnapshot) int64 { return s.LoadReports }},
		{"kvbridge_scrape_errors_total", "Failed scrapes of the engine's /metrics.", func(s engine.StatsSnapshot) int64 { return s.ScrapeErrors }},
	}
	for _, c := range counters {
		get := c.get
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(get(b.Stats().Snapshot())) }))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvbridge_registered_workers", Help: "Workers this bridge currently holds registered.",
	}, func() float64 { return float64(len(b.Records())) }))

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if len(b.Records()) == 0 {
			http.Error(w, "engine not ready or worker not registered", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// serveStatus runs the status server on addr until ctx ends.
func serveStatus(ctx context.Context, addr string, b *bridge.Bridge, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("status server %s: %w", addr, err)
	}
	srv := &http.Server{Handler: statusHandler(b), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("status server listening", "addr", l.Addr().String())
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status server failed", "err", err)
		}
	}()
	return nil
}
