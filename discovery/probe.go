package discovery

import (
	"context"
	"sync"
	"time"
)

// A backend's client often retries by itself and says nothing while it
// does (etcd's resumes a broken watch, client-go's informers relist), so an
// outage of an idle source would be invisible: a source probes its backend
// and reports each change of reachability to its Observer.

// Reachability passes changes of a backend's reachability to an Observer:
// the first report is an outage (a healthy start is not news), then every
// change. Several goroutines (a probe, a watch's error handler) may Set it.
type Reachability struct {
	obs  Observer
	mu   sync.Mutex
	down bool
}

// NewReachability reports to obs (nil: nobody).
func NewReachability(obs Observer) *Reachability {
	if obs == nil {
		obs = NopObserver{}
	}
	return &Reachability{obs: obs}
}

// Set records the outcome of a call to the backend: nil when it answered.
func (h *Reachability) Set(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if (err != nil) == h.down {
		return
	}
	h.down = err != nil
	h.obs.Health(err)
}

// Probe calls check every interval, each call bounded by timeout, and
// sets h from its answer, until ctx ends. A call cut short by ctx's end is
// not reported.
func Probe(ctx context.Context, h *Reachability, interval, timeout time.Duration, check func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := check(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.Set(err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
