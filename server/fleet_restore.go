package server

import (
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// restore adds workers from the state file (server/state.go) before the
// source has said anything: every listener hears of them as of any
// worker. They stay until the source's first full view (dropRestored).
func (f *roster) restore(recs []fleet.Worker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.restored == nil {
		f.restored = map[string]bool{}
	}
	for _, rec := range recs {
		if _, known := f.records[rec.ID]; known {
			continue // the source was first
		}
		f.records[rec.ID] = rec
		f.restored[rec.ID] = true
		spec := f.spec(rec)
		f.upsert(spec)
	}
}

// dropRestored removes the restored workers the source's first full view
// did not hold: they left while the router was down.
func (f *roster) dropRestored() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.restored {
		delete(f.records, id)
		for _, l := range f.listeners {
			l.Remove(id)
		}
		for _, l := range f.kept {
			l.Remove(id)
		}
		f.log.Info("restored worker not in discovery's view; removed", "worker", id)
	}
	f.restored = nil
}

// servingRestored reports whether the fleet routes on restored workers
// because the source's backend is away: the router can route, so it is
// ready though discovery has not synced.
func (f *roster) servingRestored() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.restored) > 0 && f.sourceDown
}

// Restarted implements fleet.RestartSink: the worker's record was
// written again under a new etcd lease while the old lease still held it,
// most likely a new process with an empty cache. Its view is marked stale
// (no overlap credit, and a resync request): a new process answers with
// its empty cache, and the old one, had it only lost its keepalive,
// re-announces what it holds. While etcd is away or just back every
// worker registers again, so that is not taken for a restart.
func (f *roster) Restarted(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.restarted == nil || f.sourceDown || time.Now().Before(f.holdUntil) {
		return
	}
	if _, known := f.records[id]; !known {
		return
	}
	f.log.Info("worker registered again under a new lease: a new process; its cached blocks are no longer credited until it resyncs", "worker", id)
	f.restarted(id)
}

var _ fleet.RestartSink = (*roster)(nil)
