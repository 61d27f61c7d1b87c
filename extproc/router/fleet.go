package router

import (
	"fmt"
	"sort"
	"sync"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/scoring"
)

// fleet is the discovery Sink: it keeps the records and mirrors them into
// the KV index, the approximate index and the current scoring pool.
type fleet struct {
	r       *Router
	mu      sync.Mutex
	records map[string]discovery.Record
}

var _ discovery.Sink = (*fleet)(nil)

func (f *fleet) spec(rec discovery.Record) scoring.WorkerSpec {
	bs := rec.BlockSize
	if f.r.cfg.BlockSize > 0 {
		bs = f.r.cfg.BlockSize
	}
	return scoring.WorkerSpec{
		ID: rec.ID, Model: rec.Model, LoRAAdapters: rec.LoRAAdapters, Address: rec.Address,
		Cluster: rec.ClusterName(), BlockSize: bs, KVTotalBlocks: rec.KVTotalBlocks,
		MaxNumBatchedTokens: rec.MaxNumBatchedTokens, MaxNumSeqs: rec.MaxNumSeqs, Weight: rec.Weight,
	}
}

// Upsert implements discovery.Sink.
func (f *fleet) Upsert(rec discovery.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, known := f.records[rec.ID]
	f.records[rec.ID] = rec
	spec := f.spec(rec)
	if c := f.r.core.Load(); c != nil {
		if err := c.router.Pool().Upsert(spec); err != nil {
			f.r.log.Warn("worker not added to the pool", "worker", rec.ID, "err", err)
		}
	}
	f.r.index.AddWorker(rec.ID, rec.Model, spec.BlockSize)
	f.r.notifyXDS()
	if !known {
		f.r.log.Info("worker added", "worker", rec.ID, "model", rec.Model, "address", rec.Address, "cluster", rec.ClusterName())
	} else if fmt.Sprint(old) != fmt.Sprint(rec) {
		f.r.log.Info("worker updated", "worker", rec.ID)
	}
}

// Remove implements discovery.Sink: the worker's index entries and load go.
func (f *fleet) Remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.records, id)
	if c := f.r.core.Load(); c != nil {
		c.router.Pool().Remove(id)
	}
	f.r.index.RemoveWorker(id)
	f.r.approx.RemoveWorker(id)
	f.r.notifyXDS()
	f.r.log.Info("worker removed", "worker", id)
}

func (f *fleet) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.records)
}

// snapshot returns the records sorted by id.
func (f *fleet) snapshot() []discovery.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]discovery.Record, 0, len(f.records))
	for _, r := range f.records {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// install fills c's pool with the fleet and makes c current, atomically
// with respect to discovery, and returns the previous core.
func (f *fleet) install(c *core) *core {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rec := range f.records {
		_ = c.router.Pool().Upsert(f.spec(rec))
	}
	return f.r.core.Swap(c)
}
