package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// EventConsumerConfig configures a EventConsumer.
type EventConsumerConfig struct {
	Namespace string
	Index     *kvindex.Index
	Metrics   EventMetrics // default NopEventMetrics
	Logger    *slog.Logger // default slog.Default()
	Buffer    int          // messages queued between NATS and the index; default 4096
	// Hold, when not nil, keeps the consumer from applying messages until
	// it is closed; they queue (up to Buffer) meanwhile. A warm start
	// subscribes, loads a peer's snapshot and Seeds, then closes Hold.
	Hold <-chan struct{}
	// JetStream, when set, makes the consumer read the durable event
	// stream Stream (EnsureEventStream) through an ordered consumer,
	// starting after the stream sequence given to SeedStream, instead of
	// the core subscription. Publishers do not change: the stream captures
	// their core publishes.
	JetStream jetstream.JetStream
	Stream    string
	// ClaimGrace is how long a worker's claim to have published a batch
	// (Published) may stay unmet before the batch counts as lost: the
	// report can overtake the batch on its way. Default 200 ms.
	ClaimGrace time.Duration
}

// EventConsumer applies KV event batches from NATS to an Index. One goroutine
// applies every message in arrival order, so each worker's batches apply in
// the order the worker published them.
//
// Sequence numbers (SeqHeader) are tracked per worker:
//   - the next number is normal;
//   - a higher one is a gap: counted, and the worker is marked stale;
//   - the same one again is a duplicate and is skipped;
//   - 0 after a known stream is a fresh start: the publisher (and with it,
//     normally, the engine) started over, so the worker is purged and its
//     stale flag cleared — the stream is whole again from here;
//   - any other lower number is a restart we cannot reason about: counted,
//     and the worker is marked stale.
//
// A stale worker resyncs on AllBlocksCleared or a fresh start. If the
// buffer overflows, NATS drops messages; the next batch shows a gap.
type EventConsumer struct {
	nc     *nats.Conn
	cfg    EventConsumerConfig
	prefix string
	done   chan struct{}
	seqs   map[string]uint64 // last sequence per worker; owned by the loop
	// floor holds, per worker, the sequence number a loaded snapshot
	// already includes: batches up to it are skipped as applied. Owned by
	// the loop (written by Seed before Hold closes).
	floor map[string]uint64
	calls chan func()
	// claims carry Published to the loop; pending holds, per worker, the
	// oldest claim not met yet (owned by the loop).
	claims  chan claim
	pending map[string]claim
	stats   consumerCounters
	started atomic.Bool
	// streamSeq is the stream sequence of the last message the loop
	// handled (applied, skipped or dropped); JetStream mode only.
	streamSeq atomic.Uint64
}

type consumerCounters struct {
	batches, applied, decodeErrors, unknownWorker, duplicates atomic.Uint64
	gaps, restarts, fresh                                     atomic.Uint64
}

// EventConsumerStats are the consumer's running totals.
type EventConsumerStats struct {
	Batches       uint64 // messages received
	Applied       uint64 // batches applied to the index
	DecodeErrors  uint64 // messages that were not a valid batch
	UnknownWorker uint64 // batches for workers the index does not know
	Duplicates    uint64 // batches whose sequence number repeated
	Gaps          uint64 // sequence gaps
	Restarts      uint64 // sequence numbers that went back, not to 0
	Fresh         uint64 // streams that started over at 0
}

// flushTimeout bounds how long Start waits for the server to confirm the
// subscription.
const flushTimeout = 5 * time.Second

// NewEventConsumer returns a consumer; Start subscribes.
func NewEventConsumer(nc *nats.Conn, cfg EventConsumerConfig) *EventConsumer {
	if cfg.Metrics == nil {
		cfg.Metrics = NopEventMetrics{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 4096
	}
	if cfg.ClaimGrace <= 0 {
		cfg.ClaimGrace = 200 * time.Millisecond
	}
	return &EventConsumer{
		nc: nc, cfg: cfg,
		prefix:  strings.TrimSuffix(EventsWildcard(cfg.Namespace), ">"),
		done:    make(chan struct{}),
		seqs:    map[string]uint64{},
		floor:   map[string]uint64{},
		calls:   make(chan func()),
		claims:  make(chan claim, 1024),
		pending: map[string]claim{},
	}
}

// Seed records the sequence numbers a loaded index snapshot includes, so
// that batches up to them are skipped and a gap after them is detected.
// Call it before Hold is closed; it must not run with the loop applying.
func (c *EventConsumer) Seed(seqs map[string]uint64) {
	for w, seq := range seqs {
		c.seqs[w], c.floor[w] = seq, seq
	}
}

// SeedStream sets the stream sequence a loaded snapshot covers: a
// JetStream consumer starts at seq+1 (0: the whole stream). Call it before
// Start.
func (c *EventConsumer) SeedStream(seq uint64) { c.streamSeq.Store(seq) }

// StreamSeq is the stream sequence of the last message handled (JetStream
// mode; inside Do it matches the index and seqs Do passes).
func (c *EventConsumer) StreamSeq() uint64 { return c.streamSeq.Load() }

// Do runs fn on the consumer's loop, between two batches, and returns
// when it has run: fn sees the index and the sequence numbers (worker →
// last applied) consistent with each other. fn must not keep seqs. Do
// returns ctx's error if ctx ends first. Once the consumer has stopped
// (Done closed) nothing applies any more and Do runs fn at once (a final
// snapshot at shutdown); before Start it returns an error.
func (c *EventConsumer) Do(ctx context.Context, fn func(seqs map[string]uint64)) error {
	if !c.started.Load() {
		return errors.New("kvindex consumer: not started")
	}
	ran := make(chan struct{})
	call := func() { defer close(ran); fn(c.seqs) }
	select {
	case c.calls <- call:
	case <-c.done:
		fn(c.seqs)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	<-ran
	return nil
}

// inMsg is one message from the durable stream with its stream sequence.
type inMsg struct {
	m   *nats.Msg
	seq uint64
}

// Start subscribes to EventsWildcard(Namespace) (or, with JetStream set,
// creates the ordered stream consumer) and applies batches until ctx
// ends; the subscription is live on the server when Start returns.
// Done is closed when the consumer has stopped. Start runs once; a
// second call returns an error.
func (c *EventConsumer) Start(ctx context.Context) error {
	if c.cfg.Index == nil {
		return errors.New("kvindex consumer: no index")
	}
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("kvindex consumer: already started")
	}
	var core chan *nats.Msg // core subscription; NATS drops messages when it is full
	var durable chan inMsg  // JetStream: the handler waits while it is full
	var stop func()
	var err error
	if c.cfg.JetStream != nil {
		durable = make(chan inMsg, c.cfg.Buffer)
		stop, err = c.consumeStream(ctx, durable)
	} else {
		core = make(chan *nats.Msg, c.cfg.Buffer)
		stop, err = c.subscribe(ctx, core)
	}
	if err != nil {
		return err
	}
	go func() {
		defer close(c.done)
		defer stop()
		if c.cfg.Hold != nil {
			select {
			case <-ctx.Done():
				return
			case <-c.cfg.Hold:
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-core:
				c.handle(m)
			case m := <-durable:
				c.handle(m.m)
				c.streamSeq.Store(m.seq)
			case fn := <-c.calls:
				fn()
			case cl := <-c.claims:
				c.claim(cl)
			}
		}
	}()
	return nil
}

func (c *EventConsumer) subscribe(ctx context.Context, ch chan *nats.Msg) (func(), error) {
	subj := EventsWildcard(c.cfg.Namespace)
	sub, err := c.nc.ChanSubscribe(subj, ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subj, err)
	}
	if err := confirm(ctx, c.nc); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe %s: flush: %w", subj, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// consumeStream reads the durable event stream from StreamSeq()+1 with an
// ordered consumer (no server-side state to clean up; it recreates itself
// after a reconnect from the last sequence delivered). The handler blocks
// while ch is full, so nothing is dropped.
func (c *EventConsumer) consumeStream(ctx context.Context, ch chan inMsg) (func(), error) {
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: []string{EventsWildcard(c.cfg.Namespace)}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if from := c.streamSeq.Load(); from > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	cons, err := c.cfg.JetStream.OrderedConsumer(cctx, c.cfg.Stream, occ)
	if err != nil {
		return nil, fmt.Errorf("consume stream %s: %w", c.cfg.Stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			c.cfg.Logger.Warn("KV event from the stream without metadata", "subject", m.Subject(), "err", err)
			return
		}
		select {
		case ch <- inMsg{m: &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, seq: md.Sequence.Stream}:
		case <-ctx.Done():
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		c.cfg.Logger.Debug("KV event stream consumer", "stream", c.cfg.Stream, "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("consume stream %s: %w", c.cfg.Stream, err)
	}
	return cc.Stop, nil
}

// Done is closed once the consumer has stopped after its context ended.
func (c *EventConsumer) Done() <-chan struct{} { return c.done }

// Stats returns the running totals.
func (c *EventConsumer) Stats() EventConsumerStats {
	s := &c.stats
	return EventConsumerStats{
		Batches: s.batches.Load(), Applied: s.applied.Load(), DecodeErrors: s.decodeErrors.Load(),
		UnknownWorker: s.unknownWorker.Load(), Duplicates: s.duplicates.Load(),
		Gaps: s.gaps.Load(), Restarts: s.restarts.Load(), Fresh: s.fresh.Load(),
	}
}

func (c *EventConsumer) handle(m *nats.Msg) {
	c.stats.batches.Add(1)
	worker, ok := strings.CutPrefix(m.Subject, c.prefix)
	if !ok || worker == "" {
		c.cfg.Metrics.Batch(worker, BatchBadSubject)
		return
	}
	ix := c.cfg.Index
	if !ix.HasWorker(worker) {
		c.stats.unknownWorker.Add(1)
		c.cfg.Metrics.Batch(worker, BatchUnknownWorker)
		return
	}
	if skip := c.sequence(worker, m.Header.Get(SeqHeader)); skip {
		c.stats.duplicates.Add(1)
		c.cfg.Metrics.Batch(worker, BatchDuplicate)
		return
	}
	b, err := kvindex.DecodeBatch(m.Data)
	if err != nil {
		c.stats.decodeErrors.Add(1)
		c.cfg.Metrics.Batch(worker, BatchDecodeError)
		c.cfg.Logger.Warn("dropping KV event batch", "worker", worker, "bytes", len(m.Data), "err", err)
		return
	}
	st := ix.Apply(worker, b)
	if st.UnknownWorker { // removed between the check and the apply
		c.stats.unknownWorker.Add(1)
		c.cfg.Metrics.Batch(worker, BatchUnknownWorker)
		return
	}
	c.stats.applied.Add(1)
	c.cfg.Metrics.Batch(worker, BatchApplied)
	c.cfg.Metrics.Applied(worker, st)
	if st.UnknownParent > 0 || st.BlockSizeMismatch > 0 {
		c.cfg.Logger.Debug("KV events not applied", "worker", worker,
			"unknown_parent", st.UnknownParent, "block_size_mismatch", st.BlockSizeMismatch)
	}
}

// sequence checks worker's sequence header and reports whether the batch
// is a duplicate to skip.
func (c *EventConsumer) sequence(worker, header string) (skip bool) {
	seq, err := strconv.ParseUint(header, 10, 64)
	if err != nil {
		c.cfg.Metrics.Sequence(worker, SeqMissing)
		return false
	}
	if floor, ok := c.floor[worker]; ok {
		if seq != 0 && seq <= floor {
			return true // the loaded snapshot holds it already
		}
		delete(c.floor, worker)
	}
	last, seen := c.seqs[worker]
	c.seqs[worker] = seq
	ix := c.cfg.Index
	switch {
	case !seen:
		if seq != 0 {
			c.cfg.Metrics.Sequence(worker, SeqJoin)
		}
	case seq == last+1:
	case seq == last:
		return true
	case seq > last:
		c.stats.gaps.Add(1)
		c.cfg.Metrics.Sequence(worker, SeqGap)
		c.cfg.Logger.Warn("KV event sequence gap", "worker", worker, "last", last, "got", seq)
		ix.MarkStale(worker)
	case seq == 0:
		c.stats.fresh.Add(1)
		c.cfg.Metrics.Sequence(worker, SeqFresh)
		c.cfg.Logger.Info("KV event stream started over", "worker", worker, "last", last)
		ix.Reset(worker)
	default:
		c.stats.restarts.Add(1)
		c.cfg.Metrics.Sequence(worker, SeqRestart)
		c.cfg.Logger.Warn("KV event sequence went back", "worker", worker, "last", last, "got", seq)
		ix.MarkStale(worker)
	}
	return false
}

// claim is a worker's word (in a load report) that it has published up to
// batch seq.
type claim struct {
	worker string
	seq    uint64
	at     time.Time
}

// Published tells the consumer that worker's publisher has numbered
// batches up to seq (a load report's kv_event_batches − 1). A batch that
// has not arrived once a later claim comes at least ClaimGrace after the
// first is lost: the worker is marked stale and the gap counted then,
// rather than at the worker's next batch, which a quiet worker may not
// send for a long time. Safe for concurrent use; claims are dropped when
// the loop is far behind.
func (c *EventConsumer) Published(worker string, seq uint64) {
	select {
	case c.claims <- claim{worker: worker, seq: seq, at: time.Now()}:
	default:
	}
}

// claim checks a worker's claim against the batches applied; loop only.
func (c *EventConsumer) claim(cl claim) {
	last, seen := c.seqs[cl.worker]
	if !seen || cl.seq <= last || !c.cfg.Index.HasWorker(cl.worker) {
		// Nothing known to compare with (a worker we have not heard from
		// joins at its next batch), nothing missing, or not ours.
		delete(c.pending, cl.worker)
		return
	}
	first, waiting := c.pending[cl.worker]
	if !waiting || first.seq <= last {
		c.pending[cl.worker] = cl
		return
	}
	if cl.at.Sub(first.at) < c.cfg.ClaimGrace {
		return
	}
	// Batches last+1 … first.seq are lost. Take first.seq as applied so
	// the next batch is in sequence; the worker stays stale until it
	// resyncs (AllBlocksCleared or a fresh stream).
	delete(c.pending, cl.worker)
	c.seqs[cl.worker] = first.seq
	c.stats.gaps.Add(1)
	c.cfg.Metrics.Sequence(cl.worker, SeqGap)
	c.cfg.Logger.Warn("KV event batches lost: the worker's load report counts batches that never arrived", "worker", cl.worker, "last", last, "published", first.seq)
	c.cfg.Index.MarkStale(cl.worker)
}
