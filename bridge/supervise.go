package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/fleet"
)

// Fallback block sizes when neither the operator nor the engine says:
// vLLM's default on GPUs and SGLang's default page size.
const (
	fallbackVLLMBlockSize   = 16
	fallbackSGLangBlockSize = 1
)

// superviseEngine is the engine's life cycle as the fleet sees it: wait
// until the engine is ready, register, report load every ScrapeInterval,
// deregister when /metrics has failed for UnhealthyAfter, and start over.
// It returns when ctx ends.
func (b *Bridge) superviseEngine(ctx context.Context, streams []*engine.Stream) {
	first := true
	for ctx.Err() == nil {
		info, ok := b.waitReady(ctx)
		if !ok {
			return
		}
		if !first {
			// The engine came back, most likely restarted: whatever the
			// router still believes about its cache is void.
			for _, s := range streams {
				s.RequestResync()
			}
		}
		b.register(ctx, info)
		if first {
			b.openForwarding(ctx)
		}
		first = false
		b.reportLoad(ctx, info, streams)
		b.deregister()
	}
}

// openForwarding lets the streams start once routers have had SettleDelay
// to see the registration.
func (b *Bridge) openForwarding(ctx context.Context) {
	if b.cfg.SettleDelay > 0 && b.cfg.Etcd != nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(b.cfg.SettleDelay):
		}
	}
	close(b.forwarding)
}

// engineInfo is what the bridge learned about a ready engine.
type engineInfo struct {
	models    engine.Models
	blockSize int
	metrics   engine.EngineMetrics
}

// waitReady polls /health, /v1/models and /metrics until all answer.
func (b *Bridge) waitReady(ctx context.Context) (engineInfo, bool) {
	poll := min(DefaultReadyPoll, b.cfg.ScrapeInterval)
	var lastErr string
	for {
		info, err := b.probe(ctx)
		if err == nil {
			b.log.Info("engine ready", "model", info.models.Base, "lora_adapters", info.models.Adapters, "block_size", info.blockSize)
			return info, true
		}
		if msg := err.Error(); msg != lastErr {
			b.log.Info("waiting for the engine", "reason", msg)
			lastErr = msg
		}
		select {
		case <-ctx.Done():
			return engineInfo{}, false
		case <-time.After(poll):
		}
	}
}

func (b *Bridge) probe(ctx context.Context) (engineInfo, error) {
	if err := b.engine.Health(ctx); err != nil {
		return engineInfo{}, err
	}
	models, err := b.engine.Models(ctx)
	if err != nil {
		return engineInfo{}, err
	}
	m, err := b.engine.Metrics(ctx)
	if err != nil {
		return engineInfo{}, err
	}
	info := engineInfo{models: models, metrics: m, blockSize: b.cfg.BlockSize}
	if info.blockSize == 0 {
		switch b.cfg.Engine {
		case engine.EngineVLLM:
			if rm, ok := m.Rank(0); ok && rm.BlockSize > 0 {
				info.blockSize = rm.BlockSize
			} else {
				info.blockSize = fallbackVLLMBlockSize
				b.log.Warn("vllm:cache_config_info has no block_size; assuming vLLM's default (set --block-size if wrong)", "block_size", info.blockSize)
			}
		case engine.EngineSGLang:
			if ps := b.engine.SGLangPageSize(ctx); ps > 0 {
				info.blockSize = ps
			} else {
				info.blockSize = fallbackSGLangBlockSize
				b.log.Warn("SGLang did not report page_size; assuming its default (set --block-size to SGLang's --page-size)", "block_size", info.blockSize)
			}
		}
	}
	return info, nil
}

// records builds one registration per data-parallel rank.
func (b *Bridge) recordsFor(info engineInfo) []fleet.Worker {
	recs := make([]fleet.Worker, 0, b.cfg.DPSize)
	for r := 0; r < b.cfg.DPSize; r++ {
		id, _ := b.WorkerID(r)
		total := b.cfg.KVTotalBlocks
		if total == 0 {
			if rm, ok := info.metrics.Rank(r); ok {
				_, total = rm.KVBlocks(info.blockSize)
			}
		}
		recs = append(recs, fleet.Worker{
			ID:                  id,
			Model:               info.models.Base,
			Address:             b.cfg.Address,
			Cluster:             b.cfg.Cluster,
			BlockSize:           info.blockSize,
			KVTotalBlocks:       total,
			MaxNumBatchedTokens: b.cfg.MaxNumBatchedTokens,
			MaxNumSeqs:          b.cfg.MaxNumSeqs,
			Weight:              b.cfg.Weight,
			LoRAAdapters:        info.models.Adapters,
			DPRank:              r,
		})
	}
	return recs
}

// register writes every rank's record, retrying until it succeeds or ctx
// ends. etcd.Registration then keeps each alive and re-registers after
// an etcd outage.
func (b *Bridge) register(ctx context.Context, info engineInfo) {
	recs := b.recordsFor(info)
	b.mu.Lock()
	b.records = recs
	b.mu.Unlock()
	if b.cfg.Etcd == nil {
		return
	}
	for _, rec := range recs {
		if err := discovery.ValidateRecord(rec); err != nil {
			b.log.Error("not registering: the engine's answers make an invalid record", "err", err)
			continue
		}
		for {
			reg, err := etcd.Register(ctx, b.cfg.Etcd, b.cfg.Namespace, rec, etcd.RegisterOptions{
				TTL: b.cfg.LeaseTTL, Logger: b.log,
			})
			if err == nil {
				b.mu.Lock()
				b.registered = append(b.registered, reg)
				b.mu.Unlock()
				b.log.Info("registered worker", "worker", rec.ID, "key", reg.Key(), "kv_total_blocks", rec.KVTotalBlocks)
				break
			}
			b.log.Warn("etcd registration failed; retrying", "worker", rec.ID, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// deregister revokes every registration, removing the workers at once.
func (b *Bridge) deregister() {
	b.mu.Lock()
	regs := b.registered
	b.registered, b.records = nil, nil
	b.mu.Unlock()
	for _, reg := range regs {
		if err := reg.Close(); err != nil {
			b.log.Warn("deregistration failed; the lease will lapse by itself", "err", err)
		} else {
			b.log.Info("deregistered worker", "key", reg.Key())
		}
	}
}

// reportLoad scrapes /metrics every ScrapeInterval and publishes one load
// report per rank, until ctx ends or the engine has been unreachable for
// UnhealthyAfter. A change of the engine's process start time makes every
// stream resync.
func (b *Bridge) reportLoad(ctx context.Context, info engineInfo, streams []*engine.Stream) {
	tick := time.NewTicker(b.cfg.ScrapeInterval)
	defer tick.Stop()
	lastOK := time.Now()
	started := info.metrics.ProcessStart
	m := info.metrics
	var err error
	failing := false
	for {
		if err == nil {
			b.publishLoad(m, info.blockSize)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m, err = b.engine.Metrics(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			b.stats.ScrapeErrors.Add(1)
			if !failing {
				b.log.Warn("engine /metrics failed", "err", err)
				failing = true
			}
			if time.Since(lastOK) >= b.cfg.UnhealthyAfter {
				b.log.Warn("engine unhealthy; leaving the fleet until it is ready again", "for", time.Since(lastOK).Round(time.Millisecond))
				return
			}
			continue
		}
		if failing {
			b.log.Info("engine /metrics answers again")
			failing = false
		}
		lastOK = time.Now()
		if m.ProcessStart != 0 && started != 0 && m.ProcessStart != started {
			b.log.Info("engine process restarted; resyncing KV events", "start_time", m.ProcessStart)
			for _, s := range streams {
				s.RequestResync()
			}
		}
		if m.ProcessStart != 0 {
			started = m.ProcessStart
		}
	}
}

func (b *Bridge) publishLoad(m engine.EngineMetrics, blockSize int) {
	now := time.Now().UnixMilli()
	for r := 0; r < b.cfg.DPSize; r++ {
		rm, ok := m.Rank(r)
		if !ok {
			continue
		}
		used, total := rm.KVBlocks(blockSize)
		if b.cfg.KVTotalBlocks > 0 {
			total = b.cfg.KVTotalBlocks
			if rm.KVUsage >= 0 && rm.KVUsedTokens < 0 {
				used = int(rm.KVUsage*float64(total) + 0.5)
			}
			used = min(used, total)
		}
		id, _ := b.WorkerID(r)
		data, err := json.Marshal(fleet.LoadReport{
			TSMillis: now, Waiting: rm.Waiting, Running: rm.Running,
			KVUsedBlocks: used, KVTotalBlocks: total, KVEventBatches: b.events.Numbered(id),
		})
		if err != nil {
			continue // a struct of ints always marshals
		}
		if err := b.cfg.NATS.Publish(bus.LoadSubject(b.cfg.Namespace, id), data); err != nil {
			b.stats.PublishErrors.Add(1)
			if !errors.Is(err, context.Canceled) {
				b.log.Debug("load report publish failed", "worker", id, "err", err)
			}
			continue
		}
		b.stats.LoadReports.Add(1)
	}
}
