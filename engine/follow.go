package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// Stats counts what following an engine did with its KV events and load. All fields
// are updated atomically; read them with Snapshot.
type Stats struct {
	Received      atomic.Int64 // live batches received
	Forwarded     atomic.Int64 // batches republished (live or replayed)
	Replayed      atomic.Int64 // of those, batches that came through replay
	Duplicates    atomic.Int64 // live batches dropped: already republished via replay
	Heals         atomic.Int64 // gaps healed completely by replay
	HealFailures  atomic.Int64 // gaps replay could not fill: the worker cleared
	Resets        atomic.Int64 // stream start, engine restart or lost connection
	Clears        atomic.Int64 // EventSink.Clear calls that succeeded (kvbridge: AllBlocksCleared published)
	Malformed     atomic.Int64 // ZMQ messages not in vLLM's frame layout
	UndecodedRank atomic.Int64 // payloads whose dp rank could not be read (sent to the endpoint's rank)
	BadRank       atomic.Int64 // batches dropped: dp rank outside the configured ranks
	PublishErrors atomic.Int64 // sink failures (kvbridge: NATS publishes)
	// HeldWhileDisconnected counts live batches not forwarded because an
	// earlier publish failed and the sink is still down; the stream is rebuilt
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

// ClearPayload encodes the synthetic batch that tells a router to forget
// everything a worker held (AllBlocksCleared, for data-parallel rank rank).
func ClearPayload(rank int) ([]byte, error) {
	r := rank
	return vllmwire.EncodeBatch(vllmwire.EventBatch{
		TS:     float64(time.Now().UnixNano()) / 1e9,
		Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}},
		DPRank: &r,
		Format: vllmwire.FormatArray,
	})
}

// EventSink receives what a stream forwards, in the engine's order: live
// and replayed batches with the engine's sequence numbers, and a Clear
// where the stream starts over (its first batch, an engine restart, a gap
// replay could not fill). The bridge's sink is NATS; a router that follows
// engines itself delivers to its KV event core (engine/feed).
type EventSink interface {
	// Publish hands one batch for worker on; seq is the engine's number for
	// it. An error marks the worker's view suspect: the stream clears and
	// rebuilds it from the engine's replay buffer once Connected is true
	// again.
	Publish(worker string, seq uint64, payload []byte) error
	// Clear says that everything worker (data-parallel rank rank) held
	// before is void; what follows rebuilds it.
	Clear(worker string, rank int) error
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
	// Gate, when not nil, holds the stream until it is closed (the
	// engine's batches wait in its socket meanwhile).
	Gate <-chan struct{}
	// Resume, when not nil, is asked once the gate opens for the engine
	// sequence number a loaded index snapshot already holds: with ok, the
	// stream picks up after it (skipping what the snapshot has, healing
	// from the replay socket what it lacks) instead of clearing the worker
	// at its first batch.
	Resume func(ctx context.Context) (seq uint64, ok bool)
}

// Follow carries one engine endpoint's KV events to a sink until ctx ends,
// with the ZMQ sequence handling (docs/architecture.md §3.2): the first batch clears the worker
// and replays the engine's buffer, a gap is filled from the replay socket
// or, when it cannot be, the worker is cleared and the log says so.
func Follow(ctx context.Context, c FollowConfig) error {
	return NewStream(c).Run(ctx)
}

// Stream carries one engine endpoint (one data-parallel rank) to a sink. One
// goroutine owns it: Run.
type Stream struct {
	rank     int
	workerID func(rank int) (string, bool)
	sub      Source
	out      EventSink
	stats    *Stats
	log      *slog.Logger
	resync   chan struct{}
	gate     <-chan struct{} // closed when batches may flow; nil: at once
	resume   func(context.Context) (uint64, bool)

	seq     Sequencer
	last    []byte         // payload of the last republished batch, for Verify
	dirty   bool           // a publish failed: the router's view is suspect
	touched map[int]string // ranks (and their worker ids) this stream published to
}

// NewStream returns the stream Follow runs, for a caller that also asks it
// to resync (RequestResync).
func NewStream(c FollowConfig) *Stream {
	if c.Stats == nil {
		c.Stats = new(Stats)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Stream{
		rank: c.Rank, workerID: c.WorkerID, sub: c.Sub, out: c.Sink, stats: c.Stats,
		gate: c.Gate, resume: c.Resume,
		log:     c.Logger.With("dp_rank", c.Rank),
		resync:  make(chan struct{}, 1),
		touched: map[int]string{},
	}
}

// RequestResync asks the stream to clear and rebuild its workers' view from
// the engine's replay buffer, e.g. after the engine was seen restarting.
// It does not block.
func (s *Stream) RequestResync() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

type received struct {
	ev  vllmzmq.Event
	err error
}

// Run carries batches until ctx ends (nil) or the source fails for good.
func (s *Stream) Run(ctx context.Context) error {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return nil
		}
	}
	if s.resume != nil {
		if seq, ok := s.resume(ctx); ok {
			s.seq.Resume(seq)
			s.log.Info("KV event stream resumes after the loaded snapshot", "seq", seq)
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

func (s *Stream) handle(ctx context.Context, ev vllmzmq.Event) {
	s.stats.Received.Add(1)
	act := s.seq.Step(ev.Seq)
	s.seq.Live(ev.Seq)
	if s.dirty && act != Drop {
		if !s.out.Connected() {
			// Rebuilding now would only fail again; the first batch after
			// the sink is back does it.
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
func (s *Stream) verify(ctx context.Context, seq uint64) Action {
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
func (s *Stream) resyncFromReplay(ctx context.Context) {
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

func (s *Stream) forwardAll(batches []vllmzmq.Replayed) {
	for _, r := range batches {
		s.forward(r.Seq, r.Payload, true)
	}
}

func (s *Stream) forward(seq uint64, payload []byte, replayed bool) {
	rank := s.rank
	if b, err := vllmwire.DecodeBatch(payload); err != nil {
		s.stats.UndecodedRank.Add(1)
	} else if b.DPRank != nil {
		rank = *b.DPRank
	}
	worker, ok := s.workerID(rank)
	if !ok {
		s.stats.BadRank.Add(1)
		s.log.Warn("dropping batch for a data-parallel rank the stream was not configured for", "batch_rank", rank, "seq", seq)
		s.seq.Forwarded(seq)
		return
	}
	s.touched[rank] = worker
	if err := s.out.Publish(worker, seq, payload); err != nil {
		s.stats.PublishErrors.Add(1)
		s.dirty = true
		s.log.Warn("forwarding a batch failed; the worker will be cleared and replayed", "err", err)
		return
	}
	s.seq.Forwarded(seq)
	s.last = payload
	s.stats.Forwarded.Add(1)
	if replayed {
		s.stats.Replayed.Add(1)
	}
}

// clear tells the sink that every worker this stream feeds starts over.
func (s *Stream) clear() {
	if w, ok := s.workerID(s.rank); ok {
		s.touched[s.rank] = w
	}
	failed := false
	for rank, worker := range s.touched {
		if err := s.out.Clear(worker, rank); err != nil {
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
