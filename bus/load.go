package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/nats-io/nats.go"
)

// LoadReports feeds the workers' load reports from NATS into a LoadSink
// (the router's scoring.Pool).
// Malformed reports and reports for unknown workers are counted and
// ignored; a report's age is measured from when it arrived, so worker
// clock skew cannot make it look fresh or stale.
type LoadReports struct {
	conn    *nats.Conn
	ns      string
	prefix  string
	pool    LoadSink
	metrics LoadMetrics
	log     *slog.Logger

	// events hears each report's kv_event_batches (FollowEvents).
	events atomic.Pointer[kvevents.Core]
	done   chan struct{}
	// batches is each worker's last kv_event_batches; a count going back
	// is a new process under the worker's id.
	batchMu  sync.Mutex
	batches  map[string]uint64
	accepted atomic.Int64
	rejected atomic.Int64
}

// NewLoadReports prepares the adapter for pool on nc under namespace; m
// counts rejected reports (nil counts nothing).
func NewLoadReports(nc *nats.Conn, namespace string, pool LoadSink, m LoadMetrics) *LoadReports {
	if m == nil {
		m = nopMetrics{}
	}
	return &LoadReports{
		conn: nc, ns: namespace, prefix: strings.TrimSuffix(LoadSubjectWildcard(namespace), ">"),
		pool: pool, metrics: m,
		log:  slog.Default().With("component", "scoring.load_reports"),
		done: make(chan struct{}), batches: map[string]uint64{},
	}
}

// SetLogger sends the adapter's log lines to l (the router's configured
// logger) instead of slog.Default(); call it before Start. nil keeps the
// default.
func (a *LoadReports) SetLogger(l *slog.Logger) {
	if l != nil {
		a.log = l.With("component", "scoring.load_reports")
	}
}

// Start subscribes to LoadSubjectWildcard and returns once the server has
// the subscription. The subscription ends when ctx does; Done is closed
// then.
func (a *LoadReports) Start(ctx context.Context) error {
	subject := LoadSubjectWildcard(a.ns)
	sub, err := a.conn.Subscribe(subject, a.receive)
	if err != nil {
		return fmt.Errorf("load reports: subscribe %s: %w", subject, err)
	}
	if err := confirm(ctx, a.conn); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("load reports: flush: %w", err)
	}
	go func() {
		defer close(a.done)
		<-ctx.Done()
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			a.log.Warn("unsubscribe", "err", err)
		}
	}()
	return nil
}

// FollowEvents passes each report's kv_event_batches to c
// (kvevents.Core.Published), so c notices a lost batch on a quiet worker.
// Call it once c applies live batches (after a warm start or a durable
// replay): a claim checked against an index still catching up is a false
// gap. Safe to call while reports arrive.
func (a *LoadReports) FollowEvents(c *kvevents.Core) { a.events.Store(c) }

// Done is closed when the adapter has stopped.
func (a *LoadReports) Done() <-chan struct{} { return a.done }

// Accepted counts reports applied to the pool.
func (a *LoadReports) Accepted() int64 { return a.accepted.Load() }

// Rejected counts reports that were malformed or named an unknown worker.
func (a *LoadReports) Rejected() int64 { return a.rejected.Load() }

func (a *LoadReports) receive(msg *nats.Msg) {
	worker, ok := strings.CutPrefix(msg.Subject, a.prefix)
	if !ok || worker == "" || strings.Contains(worker, ".") {
		a.reject(msg.Subject, fmt.Errorf("subject %q does not name one worker", msg.Subject))
		return
	}
	r, err := ParseLoadReport(msg.Data)
	if err != nil {
		a.reject(msg.Subject, err)
		return
	}
	if err := a.pool.SetLoadReport(worker, r); err != nil {
		a.reject(msg.Subject, err)
		return
	}
	a.accepted.Add(1)
	a.batchMu.Lock()
	prev := a.batches[worker]
	a.batches[worker] = r.KVEventBatches
	a.batchMu.Unlock()
	c := a.events.Load()
	switch {
	case c == nil:
	case r.KVEventBatches < prev:
		// The publisher counts fewer batches than it did: it is a new
		// process (a count of 0 included), and its cache is empty.
		c.Restarted(worker, r.KVEventBatches)
	case r.KVEventBatches > 0:
		c.Published(worker, r.KVEventBatches-1)
	}
}

func (a *LoadReports) reject(subject string, err error) {
	a.rejected.Add(1)
	a.metrics.LoadReportRejected()
	a.log.Debug("load report rejected", "subject", subject, "err", err)
}
