package vllmzmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	// Endpoint is the address the SUB socket binds, e.g.
	// "tcp://0.0.0.0:5557"; engines connect their PUB sockets to it (vLLM's
	// kv-events-config endpoint naming this host, llm-d-inference-sim's
	// --zmq-endpoint).
	Endpoint string
	// Topic is the subscription filter, a prefix of the published topic.
	// Empty receives every topic.
	Topic string
	// ReplayEndpoint is the engine's replay ROUTER, for a listener that one
	// engine publishes to (kvbridge beside it); empty disables Replay.
	ReplayEndpoint string
	// ReplayTimeout bounds one replay exchange (default 2 s).
	ReplayTimeout time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Listener is the bound side of vLLM's event protocol: one SUB socket that
// any number of engines connect their PUB sockets to, as llm-d deploys
// vLLM (every pod publishes to the endpoint picker). Messages from all
// publishers arrive interleaved; the topic (first frame) says whose each is,
// and each publisher numbers its own batches. Recv must be called from one
// goroutine.
type Listener struct {
	cfg    ListenerConfig
	sub    zmq4.Socket
	out    chan recvResult
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Listen binds the endpoint and starts receiving. The bind happens before
// Listen returns, so an address in use is reported here.
func Listen(ctx context.Context, cfg ListenerConfig) (*Listener, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("vllmzmq: listen endpoint is empty")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	sub := zmq4.NewSub(ctx)
	if err := sub.SetOption(zmq4.OptionSubscribe, cfg.Topic); err != nil {
		cancel()
		_ = sub.Close()
		return nil, fmt.Errorf("vllmzmq: subscribe %q: %w", cfg.Topic, err)
	}
	if err := sub.Listen(cfg.Endpoint); err != nil {
		cancel()
		_ = sub.Close()
		return nil, fmt.Errorf("vllmzmq: listen on %s: %w", cfg.Endpoint, err)
	}
	l := &Listener{cfg: cfg, sub: sub, out: make(chan recvResult, 256), cancel: cancel, done: make(chan struct{})}
	go l.run(ctx)
	return l, nil
}

// Addr is the bound address, e.g. to learn the port of "tcp://127.0.0.1:0".
func (l *Listener) Addr() net.Addr { return l.sub.Addr() }

// Endpoint is the bound address as a tcp:// endpoint publishers can
// connect to.
func (l *Listener) Endpoint() string {
	if a, ok := l.sub.Addr().(*net.TCPAddr); ok {
		return "tcp://" + a.String()
	}
	return l.cfg.Endpoint
}

func (l *Listener) run(ctx context.Context) {
	defer close(l.done)
	defer func() { _ = l.sub.Close() }()
	for {
		msg, err := l.sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A bound socket has no one connection to lose: a publisher
			// going away is not seen here, only in its sequence numbers
			// when it comes back.
			l.cfg.Logger.Debug("receive on KV event listener failed", "endpoint", l.cfg.Endpoint, "err", err)
			select {
			case <-time.After(10 * time.Millisecond):
				continue
			case <-ctx.Done():
				return
			}
		}
		ev, err := ParseEvent(msg.Frames)
		if err == nil && !hasTopicPrefix(msg.Frames[0], l.cfg.Topic) {
			err = fmt.Errorf("%w: topic %q does not match filter %q", ErrBadFrames, ev.Topic, l.cfg.Topic)
		}
		select {
		case l.out <- recvResult{ev: ev, err: err}:
		case <-ctx.Done():
			return
		}
	}
}

// Recv returns the next batch from any publisher. An error wrapping
// ErrBadFrames reports one malformed message (the stream goes on); other
// errors mean the listener or ctx is done.
func (l *Listener) Recv(ctx context.Context) (Event, error) {
	select {
	case r := <-l.out:
		return r.ev, r.err
	case <-ctx.Done():
		return Event{}, ctx.Err()
	case <-l.done:
		select {
		case r := <-l.out:
			return r.ev, r.err
		default:
			return Event{}, errors.New("vllmzmq: listener closed")
		}
	}
}

// Replay asks the configured replay endpoint for every buffered batch
// from start on (see Subscriber.Replay).
func (l *Listener) Replay(ctx context.Context, start uint64) ([]Replayed, error) {
	return Replay(ctx, l.cfg.ReplayEndpoint, start, l.cfg.ReplayTimeout)
}

// Close unbinds and waits for the receiving goroutine to exit.
func (l *Listener) Close() error {
	l.once.Do(l.cancel)
	<-l.done
	return nil
}
