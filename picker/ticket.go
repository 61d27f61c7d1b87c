package picker

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
)

// ticket carries a routed request through its response. Its pool changes
// when the scoring router is swapped; mu orders that move against the
// stream's own lifecycle calls.
type ticket struct {
	set     *inflight
	metrics Metrics

	mu      sync.Mutex
	pool    *scoring.Pool
	req     scoring.Request // as admitted; Hashes are kept for a move
	worker  string
	matched int
	prefill bool // PrefillDone was reported
	out     int  // output tokens so far
	freed   bool
}

var _ extproc.Ticket = (*ticket)(nil)

func (t *ticket) PrefillDone() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.freed {
		t.prefill = true
		t.pool.PrefillDone(t.req.ID)
	}
}

func (t *ticket) Progress(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.freed {
		t.out += n
		t.pool.Progress(t.req.ID, t.out)
	}
}

func (t *ticket) Served(address string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.freed {
		return
	}
	if id, ok := t.pool.WorkerByAddress(address); ok && t.pool.Move(t.req.ID, id) == nil {
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
	t.pool.Free(t.req.ID)
	t.mu.Unlock()
	t.set.forget(t)
	t.metrics.Finished(o)
}

// moveTo re-adds the request to pool in the state it reached. The old pool
// is left as it is: it is retired with its core, and freeing the request
// there would tell replica peers (bus.Sync) that it ended.
func (t *ticket) moveTo(pool *scoring.Pool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.freed || t.pool == pool {
		return
	}
	req := t.req
	if err := pool.Add(&req, t.worker, t.matched); err != nil {
		// The worker left the fleet meanwhile; its load went with it.
		t.pool = pool
		return
	}
	if t.prefill {
		pool.PrefillDone(req.ID)
	}
	if t.out > 0 {
		pool.Progress(req.ID, t.out)
	}
	t.pool = pool
}

// inflight is the set of routed requests whose response has not ended, so
// that a router swap can carry their load over.
type inflight struct {
	mu      sync.Mutex
	tickets map[*ticket]struct{}
}

// admit registers the request r routed as decision d. If the router was
// swapped while r decided, the ticket moves to the new pool at once.
func (f *inflight) admit(cur *atomic.Pointer[generation], r *scoring.Scheduler, req scoring.Request, d scoring.Decision, m Metrics) *ticket {
	t := &ticket{set: f, metrics: m, pool: r.Pool(), req: req, worker: d.Worker, matched: d.MatchedBlocks}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tickets == nil {
		f.tickets = map[*ticket]struct{}{}
	}
	f.tickets[t] = struct{}{}
	if now := cur.Load().router; now != r {
		t.moveTo(now.Pool())
	}
	return t
}

func (f *inflight) forget(t *ticket) {
	f.mu.Lock()
	delete(f.tickets, t)
	f.mu.Unlock()
}

// switchTo makes r current, moves every request in flight to its pool and
// retires the previous generation (ending its queue waits). Holding mu
// across the store and the moves keeps admit from registering a ticket on
// the old pool after the move.
func (f *inflight) switchTo(cur *atomic.Pointer[generation], r *scoring.Scheduler) {
	f.mu.Lock()
	old := cur.Swap(newGeneration(r))
	for t := range f.tickets {
		t.moveTo(r.Pool())
	}
	f.mu.Unlock()
	old.retire()
}

// generation is one scoring router as the current one; retired ends when
// it is swapped out.
type generation struct {
	router  *scoring.Scheduler
	retired context.Context
	retire  context.CancelFunc
}

func newGeneration(r *scoring.Scheduler) *generation {
	g := &generation{router: r}
	g.retired, g.retire = context.WithCancel(context.Background())
	return g
}

// len counts the requests in flight.
func (f *inflight) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.tickets)
}
