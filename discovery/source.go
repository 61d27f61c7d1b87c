package discovery

import (
	"context"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// Source is one place the fleet comes from. The router runs exactly one.
type Source interface {
	// Run mirrors the source's workers into sink until ctx ends, then
	// returns ctx's error. It reports refused records and its backend's
	// reachability to obs (nil: nobody listens). Run is called once.
	Run(ctx context.Context, sink fleet.Sink, obs Observer) error
	// Synced is closed once sink holds the source's first full view.
	Synced() <-chan struct{}
	// FlapGrace is how long a removed worker may come back as the same
	// worker with its state kept: a removal that may be a lease flap. Zero
	// means a removal is final.
	FlapGrace() time.Duration
}

// Observer hears what a Source notices besides the fleet. Both methods
// may be called from any of the source's goroutines.
type Observer interface {
	// BadRecord is called for each record the source refused: an invalid
	// etcd value, a workers file that does not parse, a pod that cannot be
	// turned into workers. where names it (key, path, pod). The source has
	// logged it; a worker it already knew keeps its last good record.
	BadRecord(where string, err error)
	// Health is called when the source's backend stops answering (err
	// non-nil) and when it answers again (nil); only changes are reported,
	// and a backend away at start is reported too. A source without a
	// backend to lose never calls it.
	Health(err error)
}

// NopObserver ignores everything; sources use it when Run is given nil.
type NopObserver struct{}

// BadRecord implements Observer.
func (NopObserver) BadRecord(string, error) {}

// Health implements Observer.
func (NopObserver) Health(error) {}

// WaitSynced waits until src has synced, ctx ends or timeout passes, and
// reports whether src synced. A start waits here rather than forever: the
// router then serves (not ready) until discovery catches up.
func WaitSynced(ctx context.Context, src Source, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-src.Synced():
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	select { // synced at the same moment: say so
	case <-src.Synced():
		return true
	default:
		return false
	}
}
