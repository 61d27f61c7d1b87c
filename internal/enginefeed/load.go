package enginefeed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/bridge"
	"github.com/kvroute/kvroute/scoring"
)

// maxMetricsBody bounds one /metrics answer.
const maxMetricsBody = 8 << 20

type scraper struct {
	engine bridge.Engine
	http   *http.Client
}

func newScraper(engine bridge.Engine) *scraper {
	return &scraper{engine: engine, http: &http.Client{Timeout: 2 * time.Second}}
}

// scrape reads and parses one engine's /metrics.
func (s *scraper) scrape(ctx context.Context, address string) (bridge.EngineMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/metrics", nil)
	if err != nil {
		return bridge.EngineMetrics{}, err
	}
	// The classic text format: prometheus_client would otherwise honour an
	// OpenMetrics or protobuf preference.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := s.http.Do(req)
	if err != nil {
		return bridge.EngineMetrics{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return bridge.EngineMetrics{}, fmt.Errorf("GET /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return bridge.EngineMetrics{}, fmt.Errorf("GET /metrics: status %d", resp.StatusCode)
	}
	return bridge.ParseMetrics(s.engine, bytes.NewReader(body))
}

// Report turns one scrape into the worker's load report: the rank's
// queues, and its KV use in blocks with the capacity the engine reports
// (vllm:cache_config_info's num_gpu_blocks), else the record's.
func Report(m bridge.EngineMetrics, spec scoring.WorkerSpec, now time.Time) (scoring.LoadReport, bool) {
	rm, ok := m.Rank(spec.DPRank)
	if !ok {
		return scoring.LoadReport{}, false
	}
	if rm.KVTotalBlocks == 0 && rm.KVTotalTokens == 0 {
		rm.KVTotalBlocks = spec.KVTotalBlocks
	}
	used, total := rm.KVBlocks(spec.BlockSize)
	return scoring.LoadReport{TSMillis: now.UnixMilli(), Waiting: rm.Waiting, Running: rm.Running,
		KVUsedBlocks: used, KVTotalBlocks: total}, true
}

func (f *Feeds) scrapeLoad(ctx context.Context, spec scoring.WorkerSpec) {
	log := f.cfg.Logger.With("worker", spec.ID)
	t := time.NewTicker(f.cfg.ScrapeInterval)
	defer t.Stop()
	failing := false
	for {
		m, err := f.http.scrape(ctx, spec.Address)
		if err == nil {
			if r, ok := Report(m, spec, time.Now()); ok {
				err = f.cfg.Pool.SetLoadReport(spec.ID, r)
			} else {
				err = fmt.Errorf("/metrics has no series for data-parallel rank %d", spec.DPRank)
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			f.stats.ScrapeErrors.Add(1)
			if !failing {
				log.Warn("engine load scrape failing; its last report ages out", "err", err)
			}
		} else {
			f.stats.LoadReports.Add(1)
			if failing {
				log.Info("engine load scrape recovered")
			}
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
