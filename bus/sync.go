package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/fleet"
	"github.com/nats-io/nats.go"
)

// syncBuffer bounds local events waiting to be published; past it events
// are dropped (and counted) rather than slowing the request path.
const syncBuffer = 8192

// DefaultHeartbeat is how often a replica says it is alive.
const DefaultHeartbeat = time.Second

// Sync shares a SyncPool's (the router's scoring.Pool's) lifecycle events with peer replicas over NATS:
// local Add, PrefillDone, Progress (when a block fills), Free and Move are
// published on SyncSubject as JSON; peers' events are applied to the pool;
// the replica's own events, recognised by router ID, are ignored.
//
// Every replica also sends a heartbeat each period; a peer silent for
// fleet.MissedHeartbeats of its own periods is presumed dead and its
// in-flight load is dropped (Pool.DropPeer), so a crashed replica's
// requests do not weigh on their workers until they age out.
type Sync struct {
	conn     *nats.Conn
	subject  string
	routerID string
	pool     SyncPool
	metrics  SyncMetrics
	log      *slog.Logger

	out      chan fleet.SyncEvent
	done     chan struct{}
	rejected atomic.Int64
	applied  atomic.Int64

	heartbeat   time.Duration
	incarnation string
	now         func() time.Time // the clock of peer expiry; tests set it

	mu    sync.Mutex
	peers map[string]*peer
	// collisionWarned is set once another process was seen under our ID.
	collisionWarned bool
}

// peer is what a replica knows of another's liveness. Guarded by Sync.mu.
type peer struct {
	lastSeen time.Time
	interval time.Duration // the peer's heartbeat period; ours until it says
}

// NewSync prepares replica sync for pool on nc under namespace. routerID
// must be unique among the replicas (a pod name, or a random ID); m counts
// rejected, dropped and expired (nil counts nothing).
func NewSync(nc *nats.Conn, namespace, routerID string, pool SyncPool, m SyncMetrics) *Sync {
	if m == nil {
		m = nopMetrics{}
	}
	return &Sync{
		conn: nc, subject: SyncSubject(namespace), routerID: routerID, pool: pool,
		metrics: m, log: slog.Default().With("component", "scoring.sync", "router", routerID),
		out: make(chan fleet.SyncEvent, syncBuffer), done: make(chan struct{}),
		heartbeat: DefaultHeartbeat, incarnation: newIncarnation(), now: time.Now, peers: map[string]*peer{},
	}
}

// SetLogger sends the adapter's log lines to l (the router's configured
// logger) instead of slog.Default(); call it before Start. nil keeps the
// default.
func (s *Sync) SetLogger(l *slog.Logger) {
	if l != nil {
		s.log = l.With("component", "scoring.sync", "router", s.routerID)
	}
}

// SetHeartbeat sets the heartbeat period (default DefaultHeartbeat); call
// it before Start. d ≤ 0 keeps the default.
func (s *Sync) SetHeartbeat(d time.Duration) {
	if d > 0 {
		s.heartbeat = d
	}
}

func newIncarnation() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Peers returns the peer routers this replica currently counts as alive.
func (s *Sync) Peers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.peers))
	for id := range s.peers {
		out = append(out, id)
	}
	return out
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
	if err := s.publish(fleet.SyncEvent{Op: fleet.OpReset, Incarnation: s.incarnation}); err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	if err := confirm(ctx, s.conn); err != nil {
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
	beat := time.NewTicker(s.heartbeat)
	defer beat.Stop()
	// Peers are checked four times a period, so a silent one is dropped
	// within a quarter period of its third missed heartbeat.
	check := time.NewTicker(s.heartbeat / 4)
	defer check.Stop()
	s.sendHeartbeat()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-s.out:
			if err := s.publish(ev); err != nil {
				s.log.Warn("publish sync event", "op", ev.Op, "err", err)
			}
		case <-beat.C:
			s.sendHeartbeat()
		case <-check.C:
			s.expirePeers()
		}
	}
}

func (s *Sync) sendHeartbeat() {
	ev := fleet.SyncEvent{Op: fleet.OpHeartbeat, IntervalMS: max(s.heartbeat.Milliseconds(), 1), Incarnation: s.incarnation}
	if err := s.publish(ev); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Debug("publish heartbeat", "err", err)
	}
}

// expirePeers drops the load of every peer silent for
// fleet.MissedHeartbeats of its heartbeat periods, and returns how many
// it dropped.
func (s *Sync) expirePeers() int {
	now := s.now()
	var dead []string
	s.mu.Lock()
	for id, p := range s.peers {
		if now.Sub(p.lastSeen) > fleet.MissedHeartbeats*p.interval {
			dead = append(dead, id)
			delete(s.peers, id)
		}
	}
	s.mu.Unlock()
	for _, id := range dead {
		n := s.pool.DropPeer(id)
		s.metrics.PeerExpired()
		s.log.Info("peer replica silent; its in-flight load is dropped", "peer", id, "requests", n, "missed_heartbeats", fleet.MissedHeartbeats)
	}
	return len(dead)
}

// notePeer records that a peer was heard from.
func (s *Sync) notePeer(ev fleet.SyncEvent) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[ev.Router]
	if p == nil {
		p = &peer{interval: s.heartbeat}
		s.peers[ev.Router] = p
	}
	p.lastSeen = now
	if ev.Op == fleet.OpHeartbeat {
		p.interval = time.Duration(ev.IntervalMS) * time.Millisecond
	}
}

// enqueue is the pool's sink: it never blocks the request path.
func (s *Sync) enqueue(ev fleet.SyncEvent) {
	select {
	case s.out <- ev:
	default:
		s.metrics.SyncDropped()
	}
}

func (s *Sync) publish(ev fleet.SyncEvent) error {
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
		if ev.Incarnation != "" && ev.Incarnation != s.incarnation {
			s.warnCollision()
		}
		return
	}
	s.notePeer(ev)
	if err := s.pool.Apply(ev); err != nil {
		s.reject("apply", err)
		return
	}
	s.applied.Add(1)
}

// warnCollision logs, once, that another live process uses our router ID:
// each ignores the other's events as its own, so their load is not shared.
func (s *Sync) warnCollision() {
	s.mu.Lock()
	warned := s.collisionWarned
	s.collisionWarned = true
	s.mu.Unlock()
	if !warned {
		s.log.Error("another kvroute replica uses this router id; give each replica its own --router-id (POD_NAME)")
	}
}

func (s *Sync) reject(stage string, err error) {
	s.rejected.Add(1)
	s.metrics.SyncRejected()
	s.log.Debug("sync event rejected", "stage", stage, "err", err)
}
