package vllmzmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// Default sizes, the same as vLLM's KVEventsConfig defaults.
const (
	DefaultBufferSteps = 10_000
	DefaultHWM         = 100_000
)

// BindMode says whether a Publisher binds or connects its PUB endpoint.
type BindMode int

const (
	// BindAuto follows vLLM: bind when the endpoint is a wildcard ("*"),
	// IPv6 any ("::"), ipc:// or inproc://; connect otherwise.
	BindAuto BindMode = iota
	// Bind always binds the PUB endpoint.
	Bind
	// Connect always connects the PUB endpoint to a bound SUB.
	Connect
)

// PublisherConfig configures a Publisher. Zero values take vLLM's defaults.
type PublisherConfig struct {
	// Endpoint is the PUB address, e.g. "tcp://*:5557".
	Endpoint string
	// ReplayEndpoint is the ROUTER address replay requests arrive on, e.g.
	// "tcp://*:5558". Empty disables replay, as in vLLM.
	ReplayEndpoint string
	// Topic is the first frame of every message.
	Topic string
	// BufferSteps is how many past batches replay can return (default 10000).
	BufferSteps int
	// HWM is the PUB queue's high-water mark; past it batches are dropped
	// (default 100000).
	HWM int
	// DPRank offsets both endpoints' ports by the rank, as vLLM does for
	// data-parallel engines.
	DPRank int
	// Mode chooses bind or connect for Endpoint; the replay endpoint is
	// always bound.
	Mode BindMode
	// Logger receives replay errors; nil means slog.Default().
	Logger *slog.Logger
}

// Publisher publishes KV event batches exactly as vLLM's ZmqEventPublisher
// does: each batch goes out as topic, 8-byte big-endian sequence (0, 1, 2,
// ...) and the payload, and is kept in a bounded buffer that a ROUTER socket
// replays on request. It is safe for concurrent use; Publish calls are
// serialized so sequence order equals send order.
type Publisher struct {
	topic    string
	log      *slog.Logger
	pub      zmq4.Socket
	replay   zmq4.Socket
	endpoint string
	replayEP string
	cancel   context.CancelFunc
	done     chan struct{}

	mu     sync.Mutex
	next   uint64
	ring   []Replayed // circular, capacity BufferSteps
	head   int        // index of the oldest entry
	n      int        // entries in use
	closed bool
}

// NewPublisher opens the PUB socket and, if configured, the replay ROUTER.
// Cancelling ctx or calling Close shuts both down.
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("vllmzmq: publisher endpoint is empty")
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.HWM <= 0 {
		cfg.HWM = DefaultHWM
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	endpoint, err := OffsetEndpointPort(cfg.Endpoint, cfg.DPRank)
	if err != nil {
		return nil, err
	}
	replayEP, err := OffsetEndpointPort(cfg.ReplayEndpoint, cfg.DPRank)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{
		topic:  cfg.Topic,
		log:    log,
		cancel: cancel,
		done:   make(chan struct{}),
		ring:   make([]Replayed, cfg.BufferSteps),
	}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		p.abort()
		return nil, fmt.Errorf("vllmzmq: set PUB high-water mark: %w", err)
	}
	bind := cfg.Mode == Bind || (cfg.Mode == BindAuto && bindsByDefault(endpoint))
	if bind {
		if err := p.pub.Listen(endpoint); err != nil {
			p.abort()
			return nil, fmt.Errorf("vllmzmq: bind PUB %s: %w", endpoint, err)
		}
		p.endpoint = boundEndpoint(endpoint, p.pub.Addr())
	} else {
		if err := p.pub.Dial(endpoint); err != nil {
			p.abort()
			return nil, fmt.Errorf("vllmzmq: connect PUB %s: %w", endpoint, err)
		}
		p.endpoint = endpoint
	}
	if replayEP == "" {
		close(p.done)
		return p, nil
	}
	p.replay = zmq4.NewRouter(ctx)
	if err := p.replay.Listen(replayEP); err != nil {
		p.abort()
		return nil, fmt.Errorf("vllmzmq: bind replay ROUTER %s: %w", replayEP, err)
	}
	p.replayEP = boundEndpoint(replayEP, p.replay.Addr())
	go p.serveReplay(ctx)
	return p, nil
}

func (p *Publisher) abort() {
	p.cancel()
	if p.pub != nil {
		_ = p.pub.Close()
	}
	if p.replay != nil {
		_ = p.replay.Close()
	}
}

// boundEndpoint reports the address a client should dial to reach a bound
// socket, with port 0 resolved to the port the kernel chose.
func boundEndpoint(endpoint string, addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return endpoint
	}
	return dialable("tcp://" + net.JoinHostPort(tcp.IP.String(), fmt.Sprint(tcp.Port)))
}

// Endpoint returns the address subscribers dial: the bound address with
// wildcards replaced by 127.0.0.1, or the connect address.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the dialable replay address, or "" without replay.
func (p *Publisher) ReplayEndpoint() string { return p.replayEP }

// Publish sends one encoded KVEventBatch and returns the sequence number it
// went out with. Like a ZMQ PUB socket, it never waits for subscribers: a
// batch nobody is connected to receive is still numbered and buffered for
// replay.
func (p *Publisher) Publish(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("vllmzmq: publisher is closed")
	}
	seq := p.next
	if err := p.pub.Send(zmq4.NewMsgFrom(EventFrames(p.topic, seq, payload)...)); err != nil {
		return 0, fmt.Errorf("vllmzmq: publish batch %d: %w", seq, err)
	}
	p.next++
	// vLLM buffers only batches it sent successfully; so do we.
	buf := make([]byte, len(payload))
	copy(buf, payload)
	p.push(Replayed{Seq: seq, Payload: buf})
	return seq, nil
}

// PublishDropped numbers and buffers a batch for replay without sending it,
// as when a real PUB socket drops a message at its high-water mark or a
// subscriber's connection loses it. Simulators and tests use it to make
// sequence gaps on purpose.
func (p *Publisher) PublishDropped(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("vllmzmq: publisher is closed")
	}
	seq := p.next
	p.next++
	buf := make([]byte, len(payload))
	copy(buf, payload)
	p.push(Replayed{Seq: seq, Payload: buf})
	return seq, nil
}

// NextSeq returns the sequence number the next Publish will use.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

func (p *Publisher) push(r Replayed) {
	if p.n < len(p.ring) {
		p.ring[(p.head+p.n)%len(p.ring)] = r
		p.n++
		return
	}
	p.ring[p.head] = r
	p.head = (p.head + 1) % len(p.ring)
}

// buffered returns the buffered batches whose sequence is at least start,
// oldest first.
func (p *Publisher) buffered(start uint64) []Replayed {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Replayed
	for i := 0; i < p.n; i++ {
		r := p.ring[(p.head+i)%len(p.ring)]
		if r.Seq >= start {
			out = append(out, r)
		}
	}
	return out
}

func (p *Publisher) serveReplay(ctx context.Context) {
	defer close(p.done)
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A peer went away; the ROUTER carries on with the others.
			continue
		}
		id, start, err := ParseReplayRequest(msg.Frames)
		if err != nil {
			p.log.Warn("invalid replay request", "err", err, "frames", len(msg.Frames))
			continue
		}
		for _, r := range p.buffered(start) {
			if err := p.replay.Send(zmq4.NewMsgFrom(ReplayReplyFrames(id, p.topic, r.Seq, r.Payload)...)); err != nil {
				p.log.Warn("replay send failed", "seq", r.Seq, "err", err)
				break
			}
		}
		if err := p.replay.Send(zmq4.NewMsgFrom(ReplayEndFrames(id)...)); err != nil {
			p.log.Warn("replay end marker send failed", "err", err)
		}
	}
}

// Close stops replay and closes both sockets. Batches still queued in the
// PUB socket may be lost, as with vLLM's linger=0 close.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	err := p.pub.Close()
	if p.replay != nil {
		if e := p.replay.Close(); e != nil && err == nil {
			err = e
		}
	}
	<-p.done
	if err != nil {
		return fmt.Errorf("vllmzmq: close publisher: %w", err)
	}
	return nil
}
