package server

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// fleetListener is one part of the router that mirrors the fleet: the
// scoring pool, the KV index, the approximate index, the xDS pusher. The
// fleet calls it under its lock, so calls arrive in discovery order.
type fleetListener interface {
	Upsert(w scoring.WorkerSpec)
	Remove(id string)
}

// fleet is the discovery Sink: it keeps the records and fans each change
// out to its listeners, in order.
type fleet struct {
	blockSize int // overrides the records' block size when > 0
	log       *slog.Logger
	listeners []fleetListener

	mu      sync.Mutex
	records map[string]scoring.WorkerSpec
}

var _ discovery.Sink = (*fleet)(nil)

// spec is the record as the router's parts see it: the cluster name filled
// in and the block size overridden when the router is configured with one.
func (f *fleet) spec(rec scoring.WorkerSpec) scoring.WorkerSpec {
	spec := rec
	spec.Cluster = rec.ClusterName()
	if f.blockSize > 0 {
		spec.BlockSize = f.blockSize
	}
	return spec
}

// Upsert implements discovery.Sink.
func (f *fleet) Upsert(rec scoring.WorkerSpec) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, known := f.records[rec.ID]
	f.records[rec.ID] = rec
	spec := f.spec(rec)
	for _, l := range f.listeners {
		l.Upsert(spec)
	}
	if !known {
		f.log.Info("worker added", "worker", rec.ID, "model", rec.Model, "address", rec.Address, "cluster", rec.ClusterName())
	} else if fmt.Sprint(old) != fmt.Sprint(rec) {
		f.log.Info("worker updated", "worker", rec.ID)
	}
}

// Remove implements discovery.Sink: the worker's index entries and load go.
func (f *fleet) Remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.records, id)
	for _, l := range f.listeners {
		l.Remove(id)
	}
	f.log.Info("worker removed", "worker", id)
}

// poolListener mirrors the fleet into the scheduler's pool.
type poolListener struct {
	pool *scoring.Pool
	log  *slog.Logger
}

func (l poolListener) Upsert(spec scoring.WorkerSpec) {
	if err := l.pool.Upsert(spec); err != nil {
		l.log.Warn("worker not added to the pool", "worker", spec.ID, "err", err)
	}
}

func (l poolListener) Remove(id string) { l.pool.Remove(id) }

// indexListener mirrors the fleet into the KV index.
type indexListener struct{ ix *kvindex.Index }

func (l indexListener) Upsert(spec scoring.WorkerSpec) {
	l.ix.AddWorker(spec.ID, spec.Model, spec.BlockSize)
}
func (l indexListener) Remove(id string) { l.ix.RemoveWorker(id) }

// approxListener drops a removed worker from the approximate index, which
// learns the others from routing decisions.
type approxListener struct{ a *kvindex.Approx }

func (approxListener) Upsert(scoring.WorkerSpec) {}
func (l approxListener) Remove(id string)        { l.a.RemoveWorker(id) }

// xdsListener tells the xDS pusher the worker set changed.
type xdsListener struct{ r *Server }

func (l xdsListener) Upsert(scoring.WorkerSpec) { l.r.notifyXDS() }
func (l xdsListener) Remove(string)             { l.r.notifyXDS() }

var (
	_ fleetListener = poolListener{}
	_ fleetListener = indexListener{}
	_ fleetListener = approxListener{}
	_ fleetListener = xdsListener{}
)

func (f *fleet) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.records)
}

// snapshot returns the records sorted by id.
func (f *fleet) snapshot() []scoring.WorkerSpec {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]scoring.WorkerSpec, 0, len(f.records))
	for _, r := range f.records {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
