package picker

import (
	"sync"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
)

// ticket carries a routed request through its response: it reports the
// stream's lifecycle calls to the scheduler's pool. mu orders them, since
// Free may come from the stream's teardown while the response path runs.
type ticket struct {
	pool    *scoring.Pool
	id      string
	metrics Metrics

	mu     sync.Mutex
	worker string
	out    int // output tokens so far
	freed  bool
}

var _ extproc.Ticket = (*ticket)(nil)

func newTicket(pool *scoring.Pool, id, worker string, m Metrics) *ticket {
	return &ticket{pool: pool, id: id, worker: worker, metrics: m}
}

func (t *ticket) PrefillDone() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.freed {
		t.pool.PrefillDone(t.id)
	}
}

func (t *ticket) ResponseStarted() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.freed {
		t.pool.ResponseStarted(t.id)
	}
}

func (t *ticket) Progress(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.freed {
		t.out += n
		t.pool.Progress(t.id, t.out)
	}
}

func (t *ticket) Served(address string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.freed {
		return
	}
	if id, ok := t.pool.WorkerByAddress(address); ok && id != t.worker && t.pool.Move(t.id, id) == nil {
		// A Gateway API data plane uses a fallback endpoint only when the
		// primary failed (connect failure, reset): passive health counts
		// that against the primary.
		t.pool.ObserveFailure(t.worker, "failed over to a fallback endpoint (connect failure or reset)")
		t.worker = id
	}
}

func (t *ticket) Free(o extproc.Outcome) {
	t.mu.Lock()
	if t.freed {
		t.mu.Unlock()
		return
	}
	t.freed = true
	t.pool.Free(t.id)
	// Passive health: a 5xx (or Envoy's reply for a connect failure) counts
	// against the worker that served; a normal end clears its record.
	// 4xx and resets say nothing about the worker (the client's fault, or
	// a cancel).
	switch o {
	case extproc.OutcomeOK:
		t.pool.Observe(t.worker, true)
	case extproc.OutcomeUpstreamError:
		t.pool.ObserveFailure(t.worker, "5xx response (the worker's, or Envoy's for a connect failure or reset)")
	case extproc.OutcomeLocalReply:
		// Not the worker's fault, but the request never reached it:
		// passed over for a moment rather than ejected.
		t.pool.ObserveLocalReply(t.worker)
	}
	t.mu.Unlock()
	t.metrics.Finished(o)
}
