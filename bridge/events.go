package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

// Stats counts what the bridge did with the engine's KV events. All fields
// are updated atomically; read them with Snapshot.
type Stats struct {
	Received      atomic.Int64 // live batches received
	Forwarded     atomic.Int64 // batches republished (live or replayed)
	Replayed      atomic.Int64 // of those, batches that came through replay
	Duplicates    atomic.Int64 // live batches dropped: already republished via replay
	Heals         atomic.Int64 // gaps healed completely by replay
	HealFailures  atomic.Int64 // gaps replay could not fill: AllBlocksCleared sent
	Resets        atomic.Int64 // bridge start, engine restart or lost connection
	Clears        atomic.Int64 // synthetic AllBlocksCleared batches published
	Malformed     atomic.Int64 // ZMQ messages not in vLLM's frame layout
	UndecodedRank atomic.Int64 // payloads whose dp rank could not be read (sent to the endpoint's rank)
	BadRank       atomic.Int64 // batches dropped: dp rank outside the configured ranks
	PublishErrors atomic.Int64 // NATS publish failures
	// HeldWhileDisconnected counts live batches not forwarded because an
	// earlier publish failed and NATS is still down; the stream is rebuilt
	// from the engine's replay buffer once it is back.
	HeldWhileDisconnected atomic.Int64
	UnknownPublisher      atomic.Int64 // batches from a publisher that is not the followed engine, dropped
	LoadReports           atomic.Int64 // load reports published
	ScrapeErrors          atomic.Int64 // failed /metrics scrapes
}

// StatsSnapshot is a plain copy of Stats.
type StatsSnapshot struct {
	Received, Forwarded, Replayed, Duplicates, Heals, HealFailures, Resets, Clears,
	Malformed, UndecodedRank, BadRank, PublishErrors, HeldWhileDisconnected, UnknownPublisher, LoadReports, ScrapeErrors int64
}

// Snapshot copies the counters.
func (s *Stats) Snapshot() StatsSnapshot {
	return StatsSnapshot{
		Received: s.Received.Load(), Forwarded: s.Forwarded.Load(), Replayed: s.Replayed.Load(),
		Duplicates: s.Duplicates.Load(), Heals: s.Heals.Load(), HealFailures: s.HealFailures.Load(),
		Resets: s.Resets.Load(), Clears: s.Clears.Load(), Malformed: s.Malformed.Load(),
		UndecodedRank: s.UndecodedRank.Load(), BadRank: s.BadRank.Load(), PublishErrors: s.PublishErrors.Load(), HeldWhileDisconnected: s.HeldWhileDisconnected.Load(),
		UnknownPublisher: s.UnknownPublisher.Load(),
		LoadReports:      s.LoadReports.Load(), ScrapeErrors: s.ScrapeErrors.Load(),
	}
}

// natsEvents republishes batches on NATS with a per-worker sequence in
// bus.SeqHeader. The sequence is the bridge's own, not the engine's: the
// bridge inserts synthetic batches and outlives engine restarts, and the
// router must see one gap-free stream per worker. It starts at 0 when the
// bridge starts, which the router reads as a fresh stream.
type natsEvents struct {
	nc *nats.Conn
	ns string

	mu   sync.Mutex
	next map[string]uint64
}

func newNATSEvents(nc *nats.Conn, ns string) *natsEvents {
	return &natsEvents{nc: nc, ns: ns, next: map[string]uint64{}}
}

// Connected implements EventSink.
func (p *natsEvents) Connected() bool { return p.nc.IsConnected() }

// Publish implements EventSink.
func (p *natsEvents) Publish(worker string, payload []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.next[worker]
	msg := nats.NewMsg(bus.EventsSubject(p.ns, worker))
	msg.Header.Set(bus.SeqHeader, strconv.FormatUint(seq, 10))
	msg.Data = payload
	// The number is spent even on failure, so the router sees a gap rather
	// than a silently missing batch.
	p.next[worker] = seq + 1
	if err := p.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish KV events for %s (seq %d): %w", worker, seq, err)
	}
	return nil
}

// Numbered is how many batches Publish has numbered for worker (a load
// report's kv_event_batches).
func (p *natsEvents) Numbered(worker string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next[worker]
}

// clearPayload encodes the synthetic batch that tells the router to forget
// everything a worker held.
func clearPayload(rank int) ([]byte, error) {
	r := rank
	return kvindex.EncodeBatch(kvindex.EventBatch{
		TS:     float64(time.Now().UnixNano()) / 1e9,
		Events: []kvindex.Event{kvindex.AllBlocksCleared{}},
		DPRank: &r,
		Format: kvindex.FormatArray,
	})
}

// EventSink receives the batches a stream forwards, in the engine's order:
// live ones, replayed ones, and the synthetic AllBlocksCleared that stands
// for a gap replay could not fill. The bridge's sink is NATS; a router that
// follows engines itself applies them to its index.
type EventSink interface {
	// Publish hands one batch for worker on. An error marks the worker's
	// view suspect: the stream clears and rebuilds it from the engine's
	// replay buffer once Connected is true again.
	Publish(worker string, payload []byte) error
	// Connected reports whether Publish can succeed now.
	Connected() bool
}

// Source is where a stream's batches come from: a subscriber dialled to
// an engine's PUB socket (vllmzmq.Subscriber), a bound listener the engine
// connects to (vllmzmq.Listener), or one publisher's share of a listener
// that many engines publish to.
type Source interface {
	// Recv returns the next live batch. An error wrapping
	// vllmzmq.ErrDisconnected or vllmzmq.ErrBadFrames lets the stream go on;
	// any other ends it.
	Recv(ctx context.Context) (vllmzmq.Event, error)
	// Replay returns the engine's buffered batches from start on
	// (vllmzmq.ErrNoReplay when it has no replay socket).
	Replay(ctx context.Context, start uint64) ([]vllmzmq.Replayed, error)
}

// FollowConfig configures Follow.
type FollowConfig struct {
	// Sub is the engine endpoint (one data-parallel rank) to follow.
	Sub Source
	// Rank is the endpoint's data-parallel rank, used for batches that do
	// not name theirs.
	Rank int
	// WorkerID maps a batch's data-parallel rank to its worker id; false
	// drops the batch.
	WorkerID func(rank int) (string, bool)
	// Sink receives the batches.
	Sink EventSink
	// Stats counts what happened; nil keeps private counters.
	Stats *Stats
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Follow carries one engine endpoint's KV events to a sink until ctx ends,
// with the bridge's sequence handling: the first batch clears the worker
// and replays the engine's buffer, a gap is filled from the replay socket
// or, when it cannot be, the worker is cleared and the log says so.
func Follow(ctx context.Context, c FollowConfig) error {
	if c.Stats == nil {
		c.Stats = new(Stats)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return newStream(c.Rank, c.WorkerID, c.Sub, c.Sink, c.Stats, c.Logger).run(ctx)
}

// stream carries one engine endpoint (one data-parallel rank) to a sink. One
// goroutine owns it: run.
type stream struct {
	rank     int
	workerID func(rank int) (string, bool)
	sub      Source
	out      EventSink
	stats    *Stats
	log      *slog.Logger
	resync   chan struct{}
	gate     <-chan struct{} // closed when batches may flow; nil: at once

	seq     Sequencer
	last    []byte         // payload of the last republished batch, for Verify
	dirty   bool           // a publish failed: the router's view is suspect
	touched map[int]string // ranks (and their worker ids) this stream published to
}

func newStream(rank int, workerID func(int) (string, bool), sub Source, out EventSink, stats *Stats, log *slog.Logger) *stream {
	return &stream{
		rank: rank, workerID: workerID, sub: sub, out: out, stats: stats,
		log:     log.With("dp_rank", rank),
		resync:  make(chan struct{}, 1),
		touched: map[int]string{},
	}
}

// requestResync asks the stream to clear and rebuild its workers' view from
// the engine's replay buffer, e.g. after the engine was seen restarting.
func (s *stream) requestResync() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

type received struct {
	ev  vllmzmq.Event
	err error
}

func (s *stream) run(ctx context.Context) error {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return nil
		}
	}
	in := make(chan received)
	go func() {
		defer close(in)
		for {
			ev, err := s.sub.Recv(ctx)
			if err != nil && ctx.Err() != nil {
				return
			}
			select {
			case in <- received{ev, err}:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			for range in {
			}
			return nil
		case <-s.resync:
			s.resyncFromReplay(ctx)
		case r, ok := <-in:
			if !ok {
				return nil
			}
			switch {
			case r.err == nil:
				s.handle(ctx, r.ev)
			case errors.Is(r.err, vllmzmq.ErrDisconnected):
				s.seq.Lost()
			case errors.Is(r.err, vllmzmq.ErrBadFrames):
				s.stats.Malformed.Add(1)
				s.log.Warn("dropping malformed ZMQ message", "err", r.err)
			default:
				return fmt.Errorf("dp rank %d: %w", s.rank, r.err)
			}
		}
	}
}

func (s *stream) handle(ctx context.Context, ev vllmzmq.Event) {
	s.stats.Received.Add(1)
	act := s.seq.Step(ev.Seq)
	s.seq.Live(ev.Seq)
	if s.dirty && act != Drop {
		if !s.out.Connected() {
			// Rebuilding now would only fail again; the first batch after
			// NATS is back does it.
			s.stats.HeldWhileDisconnected.Add(1)
			return
		}
		act = Reset
	}
	if act == Verify {
		act = s.verify(ctx, ev.Seq)
	}
	switch act {
	case Drop:
		s.stats.Duplicates.Add(1)
	case Forward:
		s.forward(ev.Seq, ev.Payload, false)
	case Heal:
		from, _ := s.seq.Next()
		replayed, err := s.sub.Replay(ctx, from)
		tail, complete := ContiguousTail(replayed, from, ev.Seq)
		if err != nil || !complete {
			s.stats.HealFailures.Add(1)
			s.log.Warn("sequence gap could not be replayed; clearing the worker's view",
				"missing_from", from, "missing_to", ev.Seq-1, "replayed", len(tail), "err", err)
			s.clear()
		} else {
			s.stats.Heals.Add(1)
			s.log.Info("sequence gap healed by replay", "from", from, "to", ev.Seq-1)
		}
		s.forwardAll(tail)
		s.forward(ev.Seq, ev.Payload, false)
	case Reset:
		s.stats.Resets.Add(1)
		s.log.Info("KV event stream (re)started; clearing the worker's view and replaying the engine's buffer", "seq", ev.Seq)
		s.clear()
		if ev.Seq > 0 {
			replayed, err := s.sub.Replay(ctx, 0)
			tail, complete := ContiguousTail(replayed, 0, ev.Seq)
			if err != nil || !complete {
				s.log.Info("engine's replay buffer does not reach back to its start; the view holds what it has",
					"replayed", len(tail), "err", err)
			}
			s.forwardAll(tail)
		}
		s.forward(ev.Seq, ev.Payload, false)
	}
}

// verify decides, after a lost connection, whether the engine is the one
// the stream was following: its replay buffer must still hold the last
// republished batch, byte for byte.
func (s *stream) verify(ctx context.Context, seq uint64) Action {
	last, _ := s.seq.Next()
	last--
	replayed, err := s.sub.Replay(ctx, last)
	if err == nil && len(replayed) > 0 && replayed[0].Seq == last && bytes.Equal(replayed[0].Payload, s.last) {
		if seq == last+1 {
			return Forward
		}
		return Heal
	}
	s.log.Info("engine after reconnect is not the one followed so far", "last_forwarded", last, "seq", seq, "replay_err", err)
	return Reset
}

// resyncFromReplay clears and replays everything the engine still buffers.
func (s *stream) resyncFromReplay(ctx context.Context) {
	s.stats.Resets.Add(1)
	s.clear()
	replayed, err := s.sub.Replay(ctx, 0)
	if err != nil {
		s.log.Warn("resync replay failed; the view starts empty", "err", err)
	}
	if len(replayed) > 0 {
		tail, _ := ContiguousTail(replayed, 0, replayed[len(replayed)-1].Seq+1)
		s.forwardAll(tail)
	}
}

func (s *stream) forwardAll(batches []vllmzmq.Replayed) {
	for _, r := range batches {
		s.forward(r.Seq, r.Payload, true)
	}
}

func (s *stream) forward(seq uint64, payload []byte, replayed bool) {
	rank := s.rank
	if b, err := kvindex.DecodeBatch(payload); err != nil {
		s.stats.UndecodedRank.Add(1)
	} else if b.DPRank != nil {
		rank = *b.DPRank
	}
	worker, ok := s.workerID(rank)
	if !ok {
		s.stats.BadRank.Add(1)
		s.log.Warn("dropping batch for a data-parallel rank the bridge was not configured for", "batch_rank", rank, "seq", seq)
		s.seq.Forwarded(seq)
		return
	}
	s.touched[rank] = worker
	if err := s.out.Publish(worker, payload); err != nil {
		s.stats.PublishErrors.Add(1)
		s.dirty = true
		s.log.Warn("NATS publish failed; the worker will be cleared and replayed", "err", err)
		return
	}
	s.seq.Forwarded(seq)
	s.last = payload
	s.stats.Forwarded.Add(1)
	if replayed {
		s.stats.Replayed.Add(1)
	}
}

// clear publishes AllBlocksCleared to every worker this stream feeds.
func (s *stream) clear() {
	if w, ok := s.workerID(s.rank); ok {
		s.touched[s.rank] = w
	}
	failed := false
	for rank, worker := range s.touched {
		payload, err := clearPayload(rank)
		if err == nil {
			err = s.out.Publish(worker, payload)
		}
		if err != nil {
			s.stats.PublishErrors.Add(1)
			s.log.Warn("could not publish AllBlocksCleared", "worker", worker, "err", err)
			failed = true
			continue
		}
		s.stats.Clears.Add(1)
	}
	s.dirty = failed
	s.seq.Cleared()
}
