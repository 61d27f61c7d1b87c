package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/kvroute/kvroute/scoring"
	"github.com/nats-io/nats.go"
)

// syncBuffer bounds local events waiting to be published; past it events
// are dropped (and counted) rather than slowing the request path.
const syncBuffer = 8192

// Sync shares a Pool's lifecycle events with peer replicas over NATS:
// local Add, PrefillDone, Progress (when a block fills), Free and Move are
// published on SyncSubject as JSON; peers' events are applied to the pool;
// the replica's own events, recognised by router ID, are ignored.
type Sync struct {
	conn     *nats.Conn
	subject  string
	routerID string
	pool     *scoring.Pool
	metrics  scoring.Metrics
	log      *slog.Logger

	out      chan scoring.SyncEvent
	done     chan struct{}
	rejected atomic.Int64
	applied  atomic.Int64
}

// NewSync prepares replica sync for pool on nc under namespace. routerID
// must be unique among the replicas (a pod name, or a random ID).
func NewSync(nc *nats.Conn, namespace, routerID string, pool *scoring.Pool) *Sync {
	return &Sync{
		conn: nc, subject: SyncSubject(namespace), routerID: routerID, pool: pool,
		metrics: pool.Metrics(), log: slog.Default().With("component", "scoring.sync", "router", routerID),
		out: make(chan scoring.SyncEvent, syncBuffer), done: make(chan struct{}),
	}
}

// Start subscribes, announces this replica (peers drop any load left from
// an earlier run under the same ID), hooks the pool and starts the
// publisher goroutine, which stops when ctx ends; Done is closed then.
func (s *Sync) Start(ctx context.Context) error {
	if s.routerID == "" {
		return errors.New("replica sync: router id is empty")
	}
	sub, err := s.conn.Subscribe(s.subject, s.receive)
	if err != nil {
		return fmt.Errorf("replica sync: subscribe %s: %w", s.subject, err)
	}
	if err := s.publish(scoring.SyncEvent{Op: scoring.OpReset}); err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	if err := s.conn.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("replica sync: flush: %w", err)
	}
	s.pool.SetSink(s.enqueue)
	go s.run(ctx, sub)
	return nil
}

// Done is closed when the publisher goroutine has stopped.
func (s *Sync) Done() <-chan struct{} { return s.done }

// Rejected counts peer messages that could not be decoded or applied.
func (s *Sync) Rejected() int64 { return s.rejected.Load() }

// Applied counts peer events applied to the pool.
func (s *Sync) Applied() int64 { return s.applied.Load() }

func (s *Sync) run(ctx context.Context, sub *nats.Subscription) {
	defer close(s.done)
	defer func() {
		s.pool.SetSink(nil)
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			s.log.Warn("unsubscribe", "err", err)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-s.out:
			if err := s.publish(ev); err != nil {
				s.log.Warn("publish sync event", "op", ev.Op, "err", err)
			}
		}
	}
}

// enqueue is the pool's sink: it never blocks the request path.
func (s *Sync) enqueue(ev scoring.SyncEvent) {
	select {
	case s.out <- ev:
	default:
		s.metrics.SyncDropped()
	}
}

func (s *Sync) publish(ev scoring.SyncEvent) error {
	ev.Router = s.routerID
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("replica sync: encode %s: %w", ev.Op, err)
	}
	if err := s.conn.Publish(s.subject, data); err != nil {
		return fmt.Errorf("replica sync: publish %s: %w", ev.Op, err)
	}
	return nil
}

func (s *Sync) receive(msg *nats.Msg) {
	ev, err := ParseSyncEvent(msg.Data)
	if err != nil {
		s.reject("decode", err)
		return
	}
	if ev.Router == s.routerID {
		return
	}
	if err := s.pool.Apply(ev); err != nil {
		s.reject("apply", err)
		return
	}
	s.applied.Add(1)
}

func (s *Sync) reject(stage string, err error) {
	s.rejected.Add(1)
	s.metrics.SyncRejected()
	s.log.Debug("sync event rejected", "stage", stage, "err", err)
}
