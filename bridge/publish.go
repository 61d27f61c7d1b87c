package bridge

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine"
	"github.com/nats-io/nats.go"
)

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

var _ engine.EventSink = (*natsEvents)(nil)

func newNATSEvents(nc *nats.Conn, ns string) *natsEvents {
	return &natsEvents{nc: nc, ns: ns, next: map[string]uint64{}}
}

// Connected implements engine.EventSink.
func (p *natsEvents) Connected() bool { return p.nc.IsConnected() }

// Publish implements engine.EventSink; the engine's number is not used.
func (p *natsEvents) Publish(worker string, _ uint64, payload []byte) error {
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

// Clear implements engine.EventSink: it publishes AllBlocksCleared, which
// routers apply like any batch.
func (p *natsEvents) Clear(worker string, rank int) error {
	payload, err := engine.ClearPayload(rank)
	if err != nil {
		return err
	}
	return p.Publish(worker, 0, payload)
}

// Numbered is how many batches Publish has numbered for worker (a load
// report's kv_event_batches).
func (p *natsEvents) Numbered(worker string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next[worker]
}
