package server

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// roster is the router's fleet.Sink: it keeps the records and fans each
// change out to its listeners, in order.
type roster struct {
	blockSize int // overrides the records' block size when > 0
	log       *slog.Logger
	// listeners are the parts of the router that mirror the fleet: the
	// scoring pool, the xDS pusher, the engine feeds, a cold start's
	// resync. The roster calls them under its lock, so calls arrive in
	// discovery order.
	listeners []fleet.Sink
	// kept are listeners whose state outlives a lease flap: on a removal
	// they hear of it only after flapGrace, and not at all when the same
	// worker (same model, block size and address) comes back first. The
	// KV index is one: an etcd lease that lapses and is re-granted would
	// otherwise purge every block the worker still holds. They hear of an
	// upsert before the listeners (upsert).
	kept      []fleet.Sink
	flapGrace time.Duration

	mu      sync.Mutex
	records map[string]fleet.Worker
	// leaving holds workers removed less than flapGrace ago, by id.
	leaving map[string]*leavingWorker
	// While etcd is away (sourceDown) and for flapGrace after it answers
	// again (holdUntil), a removal is most likely a lease that lapsed
	// because etcd itself was away, not a worker that died: such a worker
	// keeps its place everywhere (pool, xDS, index) for flapGrace while it
	// registers again, so etcd's own restart cannot empty the fleet.
	sourceDown bool
	holdUntil  time.Time
	// restored holds the workers taken from the state file that the
	// source has not confirmed yet (fleet_restore.go).
	restored map[string]bool
	// restarted drops what the router credits to a worker's old process
	// (Restarted); nil: ignored.
	restarted func(id string)
	// engineBlock holds, by worker id, the KV block size a worker's engine
	// states in its events where it differs from the record's (or from the
	// router's override): the engine's wins, as blocks of any other size
	// could never match what it caches.
	engineBlock map[string]int
	// learned is told of each block size taken from an engine (0: the
	// worker is gone); nil: ignored.
	learned func(id string, blockSize int)
}

// leavingWorker is a removed worker whose kept state waits for flapGrace.
type leavingWorker struct {
	rec   fleet.Worker
	timer *time.Timer
	// held: removed while etcd was away or recovering; it is still in
	// records and every listener, not only the kept ones.
	held bool
}

// sameIncarnation reports whether b is the same running worker as a: a
// lease flap re-registers an identical record, while a restarted or moved
// worker (new address, model or block size) holds none of a's blocks.
func sameIncarnation(a, b fleet.Worker) bool {
	return a.Model == b.Model && a.BlockSize == b.BlockSize && a.Address == b.Address && a.DPRank == b.DPRank
}

var _ fleet.Sink = (*roster)(nil)

// spec is the record as the router's parts see it: the cluster name filled
// in and the block size overridden when the router is configured with one.
func (f *roster) spec(rec fleet.Worker) fleet.Worker {
	spec := rec
	spec.Cluster = rec.ClusterName()
	if f.blockSize > 0 {
		spec.BlockSize = f.blockSize
	}
	if n := f.engineBlock[rec.ID]; n > 0 {
		spec.BlockSize = n
	}
	return spec
}

// learnBlockSize makes n the worker's block size everywhere in the router
// because its engine said so in its KV events. It reports whether the
// worker's block size changed; false for an unknown worker and for a size
// already learned (events that disagree among themselves are left to the
// block_size_mismatch count rather than flapping the worker).
func (f *roster) learnBlockSize(id string, n int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, ok := f.records[id]
	if !ok || n < 1 || f.engineBlock[id] > 0 {
		return false
	}
	configured := f.spec(rec).BlockSize
	if configured == n {
		return false
	}
	if f.engineBlock == nil {
		f.engineBlock = map[string]int{}
	}
	f.engineBlock[id] = n
	spec := f.spec(rec)
	f.upsert(spec)
	f.log.Warn("the worker's engine uses another KV block size than its record says; routing with the engine's",
		"worker", id, "configured_block_size", configured, "engine_block_size", n)
	if f.learned != nil {
		f.learned(id, n)
	}
	return true
}

// forgetBlockSize drops what was learned about a worker that is gone;
// f.mu is held.
func (f *roster) forgetBlockSize(id string) {
	if _, ok := f.engineBlock[id]; !ok {
		return
	}
	delete(f.engineBlock, id)
	if f.learned != nil {
		f.learned(id, 0)
	}
}

// upsert tells every listener of spec: the kept ones (the KV indexes)
// first, so that the index knows the worker before a listener starts its
// events (an engine feed) or asks for them (a cold start's resync): the
// event core drops a batch for a worker the index does not know. Caller
// holds mu.
func (f *roster) upsert(spec fleet.Worker) {
	for _, l := range f.kept {
		l.Upsert(spec)
	}
	for _, l := range f.listeners {
		l.Upsert(spec)
	}
}

// Upsert implements fleet.Sink.
func (f *roster) Upsert(rec fleet.Worker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, known := f.records[rec.ID]
	f.records[rec.ID] = rec
	delete(f.restored, rec.ID) // the source confirms it
	spec := f.spec(rec)
	if lw := f.leaving[rec.ID]; lw != nil {
		lw.timer.Stop()
		delete(f.leaving, rec.ID)
		if sameIncarnation(lw.rec, rec) {
			f.log.Info("worker back within the lease-flap grace; its index entries are kept", "worker", rec.ID)
		} else {
			for _, l := range f.kept {
				l.Remove(rec.ID)
			}
		}
	}
	f.upsert(spec)
	if !known {
		f.log.Info("worker added", "worker", rec.ID, "model", rec.Model, "address", rec.Address, "cluster", rec.ClusterName())
	} else if fmt.Sprint(old) != fmt.Sprint(rec) {
		f.log.Info("worker updated", "worker", rec.ID)
	}
}

// sourceHealth is told when the discovery source (etcd) stops and starts
// answering; see sourceDown.
func (f *roster) sourceHealth(up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if up && f.sourceDown {
		f.holdUntil = time.Now().Add(f.flapGrace)
	}
	f.sourceDown = !up
}

// Remove implements fleet.Sink: the worker's index entries and load go.
func (f *roster) Remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, known := f.records[id]
	if known && f.flapGrace > 0 && (f.sourceDown || time.Now().Before(f.holdUntil)) {
		f.leave(id, &leavingWorker{rec: rec, held: true})
		f.log.Warn("worker's etcd record gone while etcd was away or just back; it keeps its place for the lease-flap grace while it registers again",
			"worker", id, "grace", f.flapGrace)
		return
	}
	delete(f.records, id)
	for _, l := range f.listeners {
		l.Remove(id)
	}
	if !known || f.flapGrace <= 0 {
		f.forgetBlockSize(id)
		for _, l := range f.kept {
			l.Remove(id)
		}
		f.log.Info("worker removed", "worker", id)
		return
	}
	f.leave(id, &leavingWorker{rec: rec})
	f.log.Info("worker removed; its index entries are kept for the lease-flap grace", "worker", id, "grace", f.flapGrace)
}

// leave starts lw's grace; f.mu is held.
func (f *roster) leave(id string, lw *leavingWorker) {
	if f.leaving == nil {
		f.leaving = map[string]*leavingWorker{}
	}
	if old := f.leaving[id]; old != nil {
		old.timer.Stop()
	}
	lw.timer = time.AfterFunc(f.flapGrace, func() { f.forget(id, lw) })
	f.leaving[id] = lw
}

// forget ends a removed worker's grace: its kept state goes, unless it came
// back (or left again) since.
func (f *roster) forget(id string, lw *leavingWorker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leaving[id] != lw {
		return
	}
	delete(f.leaving, id)
	f.forgetBlockSize(id)
	if lw.held {
		delete(f.records, id)
		for _, l := range f.listeners {
			l.Remove(id)
		}
	}
	for _, l := range f.kept {
		l.Remove(id)
	}
	f.log.Info("worker gone past the lease-flap grace; its index entries are dropped", "worker", id, "was_held_in_routing", lw.held)
}

// stop cancels pending grace timers (at shutdown).
func (f *roster) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, lw := range f.leaving {
		lw.timer.Stop()
		delete(f.leaving, id)
	}
}

// poolListener mirrors the fleet into the scheduler's pool.
type poolListener struct {
	pool *scoring.Pool
	log  *slog.Logger
}

func (l poolListener) Upsert(spec fleet.Worker) {
	if err := l.pool.Upsert(spec); err != nil {
		l.log.Warn("worker not added to the pool", "worker", spec.ID, "err", err)
	}
}

func (l poolListener) Remove(id string) { l.pool.Remove(id) }

// indexListener mirrors the fleet into the KV index; with reserve, a
// record's kv_total_blocks sizes the worker's table.
type indexListener struct {
	ix      *kvindex.Index
	reserve bool
}

func (l indexListener) Upsert(spec fleet.Worker) {
	l.ix.AddWorker(spec.ID, spec.Model, spec.BlockSize)
	if l.reserve {
		l.ix.Reserve(spec.ID, spec.KVTotalBlocks)
	}
}

// reservingLoad hands load reports to the pool and tells the KV index the
// capacity each engine reports (num_gpu_blocks), so that the worker's
// table is sized once for a full cache instead of growing as it fills.
type reservingLoad struct {
	pool interface {
		SetLoadReport(worker string, r fleet.LoadReport) error
	}
	ix *kvindex.Index // nil: the index grows its tables (--index-grow-tables)
}

func (l reservingLoad) SetLoadReport(worker string, r fleet.LoadReport) error {
	if err := l.pool.SetLoadReport(worker, r); err != nil {
		return err
	}
	if l.ix != nil {
		l.ix.Reserve(worker, r.KVTotalBlocks)
	}
	return nil
}

// reserveIndex is the index reservingLoad sizes, nil with
// --index-grow-tables.
func (r *Server) reserveIndex() *kvindex.Index {
	if r.cfg.IndexGrowTables {
		return nil
	}
	return r.index
}
func (l indexListener) Remove(id string) { l.ix.RemoveWorker(id) }

// approxListener drops a removed worker from the approximate index, which
// learns the others from routing decisions.
type approxListener struct{ a *kvindex.Approx }

func (approxListener) Upsert(fleet.Worker) {}
func (l approxListener) Remove(id string)  { l.a.RemoveWorker(id) }

// xdsListener tells the xDS pusher the worker set changed.
type xdsListener struct{ r *Server }

func (l xdsListener) Upsert(fleet.Worker) { l.r.notifyXDS() }
func (l xdsListener) Remove(string)       { l.r.notifyXDS() }

var (
	_ fleet.Sink = poolListener{}
	_ fleet.Sink = indexListener{}
	_ fleet.Sink = approxListener{}
	_ fleet.Sink = xdsListener{}
)

func (f *roster) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.records)
}

// snapshot returns the records sorted by id.
func (f *roster) snapshot() []fleet.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]fleet.Worker, 0, len(f.records))
	for _, r := range f.records {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
