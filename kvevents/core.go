// Package kvevents is where KV events come in. One Core takes every
// worker's numbered event batches from whatever transport carries them —
// NATS core subjects and the durable JetStream stream (bus), an engine's
// ZMQ socket dialled or bound by the router itself (engine/feed) — and is
// the one place that keeps per-worker sequence numbers and their gap rules,
// decodes the batches, applies them to the kvindex.Index and counts what
// happened. It also seeds those sequence numbers from a loaded index
// snapshot (a warm start from a peer, a durable recovery), so the live
// tail continues exactly after the snapshot whatever the transport.
//
// Transports only deliver (worker, seq, payload) as a Delivery; rules that
// belong to one transport (the ZMQ replay socket that heals a gap before
// the core sees it, JetStream's stream position) stay with it
// (docs/architecture.md §3.2).
//
// A new transport: name the worker and its publisher's number for each
// batch, keep each worker's batches in order, and hand them to Deliver (or
// Offer, where a dropped batch may show as a gap); deliver a Reset where
// the transport itself knows the worker's stream started over. Add it to
// the transports of TestSequenceRules.
package kvevents

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/inbox"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
)

// Delivery is one batch a transport hands to the core.
type Delivery struct {
	// Worker names the worker the batch is for; empty means the transport
	// could not tell (counted as BatchBadSubject and dropped).
	Worker string
	// Seq is the publisher's batch number for Worker: kvbridge's or kvsim's
	// own numbering over NATS (bus.SeqHeader), the engine's own over ZMQ.
	Seq uint64
	// NoSeq says the batch carried no number: it is applied unchecked and
	// counted as SeqMissing.
	NoSeq bool
	// Payload is one vLLM KVEventBatch, msgpack.
	Payload []byte
	// Cursor is the transport's position once this batch is handled (the
	// JetStream stream sequence); 0 leaves Core.Cursor as it is.
	Cursor uint64
	// Reset, instead of a batch, says the transport starts Worker's stream
	// over here: the worker is purged, its staleness cleared and its
	// sequence forgotten, so the next batch joins afresh. Payload is unused.
	Reset bool
}

// Config configures a Core.
type Config struct {
	// Index receives the batches; required.
	Index *kvindex.Index
	// Metrics; nil means NopMetrics.
	Metrics Metrics
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Buffer is how many deliveries queue between the transports and the
	// index (default 4096). Offer drops when it is full; Deliver waits.
	Buffer int
	// Hold, when not nil, keeps the core from applying deliveries until it
	// is closed; they queue (up to Buffer) meanwhile. A warm start lets the
	// transports start, loads a peer's snapshot and Seeds, then closes Hold.
	Hold <-chan struct{}
	// ClaimGrace is how long a worker's claim to have published a batch
	// (Published) may stay unmet before the batch counts as lost: the
	// claim can overtake the batch on its way. Default 200 ms.
	ClaimGrace time.Duration
	// BlockSize, when not nil, is told when a worker's engine states a
	// block size (in its BlockStored events) other than the one the
	// worker is registered with. It returns true when the worker now has
	// the engine's block size in the index (the router learned it); the
	// core then applies the batch again, so its blocks are not lost. It
	// runs on the core's goroutine and must not call the core.
	BlockSize func(worker string, engine int) bool
}

// Core applies delivered KV event batches to an Index. One goroutine (the
// loop) applies every delivery in arrival order and owns the sequence
// state, so each worker's batches apply in the order its transport
// delivered them.
//
// Sequence numbers are tracked per worker:
//   - the next number is normal;
//   - a higher one is a gap: counted, and the worker is marked stale;
//   - the same one again is a duplicate and is skipped;
//   - 0 after a known stream is a fresh start: the publisher (and with it,
//     normally, the engine) started over, so the worker is purged and its
//     stale flag cleared — the stream is whole again from here;
//   - any other lower number is a restart we cannot reason about: counted,
//     and the worker is marked stale;
//   - after Seed, numbers up to the seeded one (other than 0) are already in
//     the loaded snapshot and are skipped.
//
// A stale worker resyncs on AllBlocksCleared, a fresh start or a Reset
// delivery.
type Core struct {
	cfg   Config
	in    *inbox.Queue[Delivery]
	done  chan struct{}
	calls chan func()
	// seqs holds the last sequence number per worker; floor, per worker,
	// the number a loaded snapshot already includes. Both are owned by the
	// loop (written by Seed before the loop applies anything).
	seqs  map[string]uint64
	floor map[string]uint64
	// claims carry Published to the loop; pending holds, per worker, the
	// oldest claim not met yet (owned by the loop).
	claims  chan claim
	pending map[string]claim
	stats   counters
	started atomic.Bool
	cursor  atomic.Uint64
}

type counters struct {
	batches, applied, decodeErrors, unknownWorker, duplicates atomic.Uint64
	gaps, restarts, fresh                                     atomic.Uint64
}

// Stats are the core's running totals.
type Stats struct {
	Batches       uint64 // batches delivered
	Applied       uint64 // batches applied to the index
	DecodeErrors  uint64 // deliveries that were not a valid batch
	UnknownWorker uint64 // batches for workers the index does not know
	Duplicates    uint64 // batches skipped: their number repeated or a loaded snapshot holds them
	Gaps          uint64 // sequence gaps
	Restarts      uint64 // sequence numbers that went back, not to 0
	Fresh         uint64 // streams that started over (0, or a transport's Reset)
}

// New returns a core; Start runs its loop.
func New(cfg Config) *Core {
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
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
	return &Core{
		cfg:     cfg,
		in:      inbox.New[Delivery](cfg.Buffer),
		done:    make(chan struct{}),
		calls:   make(chan func()),
		seqs:    map[string]uint64{},
		floor:   map[string]uint64{},
		claims:  make(chan claim, 1024),
		pending: map[string]claim{},
	}
}

// Seed records the sequence numbers a loaded index snapshot includes, so
// that batches up to them are skipped and a gap after them is detected.
// Call it before Start, or before Hold is closed.
func (c *Core) Seed(seqs map[string]uint64) {
	for w, seq := range seqs {
		c.seqs[w], c.floor[w] = seq, seq
	}
}

// SeedCursor sets the transport position a loaded snapshot covers (the
// JetStream stream sequence). Call it before the transport starts.
func (c *Core) SeedCursor(seq uint64) { c.cursor.Store(seq) }

// Cursor is the transport position of the last delivery handled that
// carried one (inside Do it matches the index and seqs Do passes).
func (c *Core) Cursor() uint64 { return c.cursor.Load() }

// Start runs the loop until ctx ends; Done is closed then. Start runs
// once; a second call returns an error.
func (c *Core) Start(ctx context.Context) error {
	if c.cfg.Index == nil {
		return errors.New("kv events: no index")
	}
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("kv events: already started")
	}
	go c.run(ctx)
	return nil
}

func (c *Core) run(ctx context.Context) {
	defer close(c.done)
	if c.cfg.Hold != nil {
		select {
		case <-ctx.Done():
			return
		case <-c.cfg.Hold:
		}
	}
	var batch []Delivery
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.in.Ready():
			// Everything queued at once: one wake-up for a burst, not
			// one per batch.
			batch = c.in.Take(batch)
			for i, d := range batch {
				c.handle(d)
				if d.Cursor > 0 {
					c.cursor.Store(d.Cursor)
				}
				batch[i] = Delivery{}
				if !c.between(ctx) {
					return
				}
			}
		case fn := <-c.calls:
			fn()
		case cl := <-c.claims:
			c.claim(cl)
		}
	}
}

// between runs, between two deliveries of a take, what the loop would
// have run there (a Do, a claim) and reports whether the loop goes on.
// One channel per select: a select of one case and a default looks at an
// empty channel without locking it.
func (c *Core) between(ctx context.Context) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		default:
		}
		select {
		case fn := <-c.calls:
			fn()
			continue
		default:
		}
		select {
		case cl := <-c.claims:
			c.claim(cl)
			continue
		default:
		}
		return true
	}
}

// ErrStopped is returned by Deliver once the core has stopped.
var ErrStopped = errors.New("kv events: core stopped")

// Deliver queues d, waiting while the buffer is full, until ctx ends (its
// error is returned) or the core has stopped (ErrStopped). Transports that
// must not lose a batch (the durable stream, ZMQ feeds) use it.
func (c *Core) Deliver(ctx context.Context, d Delivery) error {
	if err := c.in.Put(ctx, c.done, d); errors.Is(err, inbox.ErrStopped) {
		return ErrStopped
	} else if err != nil {
		return err
	}
	return nil
}

// Offer queues d unless the buffer is full, and reports whether it did. A
// dropped batch shows as a gap at the worker's next one; the NATS core
// subscription uses it, as NATS itself drops for a slow consumer.
func (c *Core) Offer(d Delivery) bool { return c.in.Offer(d) }

// Do runs fn on the loop, between two deliveries, and returns when it has
// run: fn sees the index and the sequence numbers (worker → last applied)
// consistent with each other. fn must not keep seqs. Do returns ctx's
// error if ctx ends first. Once the core has stopped (Done closed) nothing
// applies any more and Do runs fn at once (a final snapshot at shutdown);
// before Start it returns an error.
func (c *Core) Do(ctx context.Context, fn func(seqs map[string]uint64)) error {
	if !c.started.Load() {
		return errors.New("kv events: not started")
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

// Resume returns the sequence number a loaded snapshot holds for worker,
// while no batch of the worker has been delivered since: a transport that
// keeps its own position (a ZMQ stream healing gaps from the engine's
// replay socket) picks up after it instead of starting over. It waits for
// Hold like every delivery.
func (c *Core) Resume(ctx context.Context, worker string) (seq uint64, ok bool) {
	_ = c.Do(ctx, func(map[string]uint64) { seq, ok = c.floor[worker] })
	return seq, ok
}

// Done is closed once the loop has stopped after its context ended.
func (c *Core) Done() <-chan struct{} { return c.done }

// Queued is the number of deliveries waiting for the loop: at Config.Buffer
// Offer drops and Deliver waits.
func (c *Core) Queued() int { return c.in.Len() }

// Stats returns the running totals.
func (c *Core) Stats() Stats {
	s := &c.stats
	return Stats{
		Batches: s.batches.Load(), Applied: s.applied.Load(), DecodeErrors: s.decodeErrors.Load(),
		UnknownWorker: s.unknownWorker.Load(), Duplicates: s.duplicates.Load(),
		Gaps: s.gaps.Load(), Restarts: s.restarts.Load(), Fresh: s.fresh.Load(),
	}
}

func (c *Core) handle(d Delivery) {
	worker, m := d.Worker, c.cfg.Metrics
	if worker == "" {
		c.stats.batches.Add(1)
		m.Batch(worker, BatchBadSubject)
		return
	}
	ix := c.cfg.Index
	if d.Reset {
		if !ix.HasWorker(worker) {
			return
		}
		delete(c.seqs, worker)
		delete(c.floor, worker)
		delete(c.pending, worker)
		c.stats.fresh.Add(1)
		m.Sequence(worker, SeqFresh)
		ix.Reset(worker)
		return
	}
	c.stats.batches.Add(1)
	if !ix.HasWorker(worker) {
		c.stats.unknownWorker.Add(1)
		m.Batch(worker, BatchUnknownWorker)
		return
	}
	if skip := c.sequence(worker, d); skip {
		c.stats.duplicates.Add(1)
		m.Batch(worker, BatchDuplicate)
		return
	}
	b, err := vllmwire.DecodeBatch(d.Payload)
	if err != nil {
		c.stats.decodeErrors.Add(1)
		m.Batch(worker, BatchDecodeError)
		c.cfg.Logger.Warn("dropping KV event batch", "worker", worker, "bytes", len(d.Payload), "err", err)
		return
	}
	st := ix.Apply(worker, b)
	if st.BlockSizeMismatch > 0 && st.EngineBlockSize > 0 && c.cfg.BlockSize != nil && c.cfg.BlockSize(worker, st.EngineBlockSize) {
		st = ix.Apply(worker, b)
	}
	if st.UnknownWorker { // removed between the check and the apply
		c.stats.unknownWorker.Add(1)
		m.Batch(worker, BatchUnknownWorker)
		return
	}
	c.stats.applied.Add(1)
	m.Batch(worker, BatchApplied)
	m.Applied(worker, st)
	if st.UnknownParent > 0 || st.BlockSizeMismatch > 0 {
		c.cfg.Logger.Debug("KV events not applied", "worker", worker,
			"unknown_parent", st.UnknownParent, "block_size_mismatch", st.BlockSizeMismatch)
	}
}
