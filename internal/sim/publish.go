package sim

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// Event batching defaults: a batch closes at this many events or, with a
// flush interval, this long after its first event, whichever comes first.
// Without one (the default) the events of each engine step go out as soon
// as the step ends, as vLLM publishes them: a prompt's last BlockStored
// then arrives with its first token.
const (
	DefaultEventBatchMax      = 256
	DefaultEventFlushInterval = 0
)

// The fields vLLM 0.32 sets on every event of a model with one
// full-attention KV cache group.
var (
	mediumGPU    = vllmwire.MediumGPU
	groupZero    int64
	specFullAttn = "full_attention"
)

// noExtraKeys is extra_keys for n blocks without any: vLLM 0.32 publishes
// one None per block rather than leaving the field out. The common short
// lists are encoded once.
func noExtraKeys(n int) msgpack.RawMessage {
	if n < len(shortNoExtraKeys) {
		return shortNoExtraKeys[n]
	}
	return encodeNoExtraKeys(n)
}

var shortNoExtraKeys = func() []msgpack.RawMessage {
	out := make([]msgpack.RawMessage, 64)
	for n := range out {
		out[n] = encodeNoExtraKeys(n)
	}
	return out
}()

func encodeNoExtraKeys(n int) msgpack.RawMessage {
	raw, err := msgpack.Marshal(make([]any, n))
	if err != nil { // cannot happen for a list of nils
		return nil
	}
	return raw
}

// toKVIndex converts an engine event to vllmwire's mirror of vLLM's types,
// copying the engine's slices, with the fields vLLM 0.32 fills in.
func toKVIndex(e Event) vllmwire.Event {
	switch e.Kind {
	case BlockStored:
		ev := vllmwire.BlockStored{
			BlockHashes: make([]vllmwire.EngineHash, len(e.Hashes)),
			TokenIDs:    make([]uint32, len(e.Tokens)),
			BlockSize:   e.BlockSize,
			Medium:      &mediumGPU,
			GroupIdx:    &groupZero,
			// vLLM 0.32 names the cache group's kind on every BlockStored.
			KVCacheSpecKind: &specFullAttn,
		}
		for i, h := range e.Hashes {
			ev.BlockHashes[i] = vllmwire.HashInt(h)
		}
		for i, t := range e.Tokens {
			ev.TokenIDs[i] = uint32(t)
		}
		if e.HasParent {
			p := vllmwire.HashInt(e.Parent)
			ev.ParentBlockHash = &p
		}
		ev.ExtraKeys = kvindex.EncodeMMExtraKeys(e.MMKeys, len(e.Hashes))
		if ev.ExtraKeys == nil {
			ev.ExtraKeys = noExtraKeys(len(e.Hashes))
		}
		return ev
	case BlockRemoved:
		ev := vllmwire.BlockRemoved{BlockHashes: make([]vllmwire.EngineHash, len(e.Hashes)), Medium: &mediumGPU, GroupIdx: &groupZero}
		for i, h := range e.Hashes {
			ev.BlockHashes[i] = vllmwire.HashInt(h)
		}
		return ev
	default:
		return vllmwire.AllBlocksCleared{}
	}
}

// eventPublisher batches a worker's KV events and publishes each batch,
// encoded as vLLM's KVEventBatch, to NATS (with the Kvroute-Seq header) and
// optionally to a vLLM-style ZMQ PUB socket. Sequence numbers start at 0
// and grow by one per batch, as vLLM's do; a dropped batch still consumes
// its number so consumers see the gap.
type eventPublisher struct {
	nc      *nats.Conn
	subject string
	zmq     *vllmzmq.Publisher
	rank    int
	max     int
	every   time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	pending []vllmwire.Event
	kick    chan struct{}
	full    chan struct{}

	// Only the run goroutine touches these.
	seq uint64
	buf []byte

	// numbered is seq as load reports read it: batches numbered so far.
	numbered          atomic.Uint64
	dropNext, dupNext atomic.Int64
	dropNextZMQ       atomic.Int64
	published         atomic.Uint64
	dropped           atomic.Uint64
	failures          atomic.Uint64
}

func newEventPublisher(nc *nats.Conn, subject string, zmq *vllmzmq.Publisher, rank, max int, every time.Duration, log *slog.Logger) *eventPublisher {
	if max <= 0 {
		max = DefaultEventBatchMax
	}
	if every < 0 {
		every = DefaultEventFlushInterval
	}
	return &eventPublisher{
		nc: nc, subject: subject, zmq: zmq, rank: rank, max: max, every: every, log: log,
		kick: make(chan struct{}, 1), full: make(chan struct{}, 1),
	}
}

// add queues events; called by the worker loop.
func (p *eventPublisher) add(evs []vllmwire.Event) {
	if len(evs) == 0 {
		return
	}
	p.mu.Lock()
	wasEmpty := len(p.pending) == 0
	p.pending = append(p.pending, evs...)
	n := len(p.pending)
	p.mu.Unlock()
	if wasEmpty {
		signal(p.kick)
	}
	if n >= p.max {
		signal(p.full)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// run flushes batches until ctx ends, then flushes what is left.
func (p *eventPublisher) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			p.flush()
			return
		case <-p.kick:
		}
		if p.every > 0 {
			timer.Reset(p.every)
			select {
			case <-ctx.Done():
				timer.Stop()
				p.flush()
				return
			case <-timer.C:
			case <-p.full:
				timer.Stop()
			}
		}
		p.flush()
	}
}

// flush publishes everything pending in batches of at most max events.
func (p *eventPublisher) flush() {
	p.mu.Lock()
	evs := p.pending
	p.pending = nil
	p.mu.Unlock()
	for len(evs) > 0 {
		n := min(len(evs), p.max)
		p.publish(evs[:n])
		evs = evs[n:]
	}
}

func (p *eventPublisher) publish(evs []vllmwire.Event) {
	rank := p.rank
	b := vllmwire.EventBatch{
		TS:     float64(time.Now().UnixNano()) / 1e9,
		Events: evs,
		DPRank: &rank,
		// vLLM 0.32: an array batch whose events are tagged maps.
		Format: vllmwire.FormatEventMaps,
	}
	var err error
	p.buf, err = vllmwire.AppendBatch(p.buf[:0], b)
	if err != nil {
		p.failures.Add(1)
		p.log.Error("encode KV event batch", "err", err)
		return
	}
	seq := p.seq
	p.seq++
	defer p.numbered.Store(p.seq) // once sent (or lost): a report must not claim a batch still on its way
	if p.zmq != nil {
		// The ZMQ publisher numbers batches itself (the same 0, 1, 2, ...) and
		// keeps payloads for replay, so it gets its own copy. A dropped ZMQ
		// batch is numbered and kept for replay but never sent, as a batch
		// lost on the wire would be: consumers see the gap and can replay it.
		publish := p.zmq.Publish
		if takeOne(&p.dropNextZMQ) {
			publish = p.zmq.PublishDropped
			p.log.Info("fault: dropped KV event batch on ZMQ (kept for replay)", "seq", seq)
		}
		if _, err := publish(append([]byte(nil), p.buf...)); err != nil {
			p.failures.Add(1)
			p.log.Warn("publish KV events to ZMQ", "seq", seq, "err", err)
		}
	}
	if p.nc == nil {
		p.published.Add(1)
		return
	}
	if takeOne(&p.dropNext) {
		p.dropped.Add(1)
		p.log.Info("fault: dropped KV event batch", "seq", seq)
		return
	}
	copies := 1
	if takeOne(&p.dupNext) {
		copies = 2
		p.log.Info("fault: duplicated KV event batch", "seq", seq)
	}
	for range copies {
		msg := &nats.Msg{Subject: p.subject, Data: p.buf, Header: nats.Header{}}
		msg.Header.Set(bus.SeqHeader, strconv.FormatUint(seq, 10))
		if err := p.nc.PublishMsg(msg); err != nil {
			p.failures.Add(1)
			p.log.Warn("publish KV events to NATS", "seq", seq, "err", err)
		}
	}
	p.published.Add(1)
}

// takeOne decrements a positive counter and reports whether it did.
func takeOne(c *atomic.Int64) bool {
	for {
		n := c.Load()
		if n <= 0 {
			return false
		}
		if c.CompareAndSwap(n, n-1) {
			return true
		}
	}
}
