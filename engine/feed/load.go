package feed

import (
	"context"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/fleet"
)

// Report turns one scrape into the worker's load report: the rank's
// queues, and its KV use in blocks with the capacity the engine reports
// (vllm:cache_config_info's num_gpu_blocks), else the record's.
func Report(m engine.EngineMetrics, spec fleet.Worker, now time.Time) (fleet.LoadReport, bool) {
	rm, ok := m.Rank(spec.DPRank)
	if !ok {
		return fleet.LoadReport{}, false
	}
	if rm.KVTotalBlocks == 0 && rm.KVTotalTokens == 0 {
		rm.KVTotalBlocks = spec.KVTotalBlocks
	}
	used, total := rm.KVBlocks(spec.BlockSize)
	return fleet.LoadReport{TSMillis: now.UnixMilli(), Waiting: rm.Waiting, Running: rm.Running,
		KVUsedBlocks: used, KVTotalBlocks: total}, true
}

func (f *Feeds) scrapeLoad(ctx context.Context, spec fleet.Worker) {
	log := f.cfg.Logger.With("worker", spec.ID)
	client := engine.NewClient("http://"+spec.Address, f.cfg.Engine, 2*time.Second)
	t := time.NewTicker(f.cfg.ScrapeInterval)
	defer t.Stop()
	failing := false
	for {
		m, err := client.Metrics(ctx)
		if err == nil && f.cfg.BlockSize != nil {
			// The engine says how it caches; a record that says otherwise
			// would make every one of its blocks unmatchable.
			if rm, ok := m.Rank(spec.DPRank); ok && rm.BlockSize > 0 && rm.BlockSize != spec.BlockSize && f.cfg.BlockSize(spec.ID, rm.BlockSize) {
				return // the worker was upserted again, with a scraper of its own
			}
		}
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
