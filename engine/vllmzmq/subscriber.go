package vllmzmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrDisconnected is returned by Subscriber.Recv once after the connection
// to the publisher was lost. The subscriber reconnects by itself; batches
// published meanwhile are missing, and the engine may have restarted, so its
// sequence may start again from 0.
var ErrDisconnected = errors.New("vllmzmq: connection to publisher lost")

// ErrNoReplay is returned by Replay when no replay endpoint is configured.
var ErrNoReplay = errors.New("vllmzmq: no replay endpoint configured")

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB address, e.g. "tcp://127.0.0.1:5557".
	Endpoint string
	// ReplayEndpoint is the engine's replay ROUTER, e.g.
	// "tcp://127.0.0.1:5558"; empty disables Replay.
	ReplayEndpoint string
	// Topic is the subscription filter, a prefix of the published topic.
	// Empty receives every topic.
	Topic string
	// ReplayTimeout bounds one replay exchange, from request to end marker
	// (default 2 s).
	ReplayTimeout time.Duration
	// RetryInterval is the wait between connection attempts (default 250 ms).
	RetryInterval time.Duration
	// Logger receives connection notices; nil means slog.Default().
	Logger *slog.Logger
}

// Subscriber receives batches from one engine PUB endpoint and can ask the
// engine's replay socket for missed ones. Recv must be called from one
// goroutine; Replay may run concurrently with it.
type Subscriber struct {
	cfg    SubscriberConfig
	log    *slog.Logger
	out    chan recvResult
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

type recvResult struct {
	ev  Event
	err error
}

// Dial starts a subscriber. It returns at once; the connection is made, and
// remade after a loss, in the background until ctx ends or Close is called.
func Dial(ctx context.Context, cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("vllmzmq: subscriber endpoint is empty")
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 250 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Subscriber{
		cfg:    cfg,
		log:    cfg.Logger,
		out:    make(chan recvResult, 256),
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go s.run(ctx)
	return s, nil
}

// run owns the SUB socket. zmq4's own automatic reconnect is not used
// because it reports the lost connection only after the new one is up, so
// the loss could not be ordered against new batches; here one socket lives
// per connection and the loss is delivered between the two.
func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		switch s.connectOnce(ctx) {
		case shutDown:
			return
		case dialFailed:
			// Nothing was connected, so nothing new was lost: retry quietly.
			select {
			case <-time.After(s.cfg.RetryInterval):
			case <-ctx.Done():
				return
			}
		case connectionLost:
			select {
			case s.out <- recvResult{err: ErrDisconnected}:
			case <-ctx.Done():
				return
			}
			s.log.Warn("lost connection to engine KV event publisher; reconnecting", "endpoint", s.cfg.Endpoint)
		}
	}
}

// connectEnd says how one connection attempt ended.
type connectEnd int

const (
	shutDown       connectEnd = iota // ctx is done or the socket cannot subscribe
	dialFailed                       // no connection was made
	connectionLost                   // a connection was made and then lost
)

// connectOnce dials and forwards messages until the connection fails.
func (s *Subscriber) connectOnce(ctx context.Context) connectEnd {
	sockCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sockCtx, zmq4.WithDialerRetry(s.cfg.RetryInterval), zmq4.WithDialerMaxRetries(-1),
		zmq4.WithDialerTimeout(2*time.Second))
	defer func() { _ = sub.Close() }()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		s.log.Error("subscribe failed", "topic", s.cfg.Topic, "err", err)
		return shutDown
	}
	if err := sub.Dial(s.cfg.Endpoint); err != nil {
		if ctx.Err() != nil {
			return shutDown
		}
		// zmq4 retries refused TCP dials itself; this is a failed ZMTP
		// handshake, e.g. with a publisher that was shutting down.
		s.log.Error("dial engine KV event publisher failed", "endpoint", s.cfg.Endpoint, "err", err)
		return dialFailed
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return shutDown
			}
			return connectionLost
		}
		ev, err := ParseEvent(msg.Frames)
		if err == nil && !hasTopicPrefix(msg.Frames[0], s.cfg.Topic) {
			err = fmt.Errorf("%w: topic %q does not match filter %q", ErrBadFrames, ev.Topic, s.cfg.Topic)
		}
		select {
		case s.out <- recvResult{ev: ev, err: err}:
		case <-ctx.Done():
			return shutDown
		}
	}
}

// Recv returns the next batch. An error wrapping ErrBadFrames reports one
// malformed message (the stream goes on); ErrDisconnected reports a lost
// connection (the stream goes on after reconnecting); other errors mean the
// subscriber or ctx is done.
func (s *Subscriber) Recv(ctx context.Context) (Event, error) {
	select {
	case r := <-s.out:
		return r.ev, r.err
	case <-ctx.Done():
		return Event{}, ctx.Err()
	case <-s.done:
		// Drain what arrived before shutdown.
		select {
		case r := <-s.out:
			return r.ev, r.err
		default:
			return Event{}, errors.New("vllmzmq: subscriber closed")
		}
	}
}

// Replay asks the engine for every buffered batch with a sequence of at
// least start and returns them in order, up to the end marker. The engine
// silently omits batches that fell out of its buffer, so the caller checks
// whether the first returned sequence is the one it asked for.
func (s *Subscriber) Replay(ctx context.Context, start uint64) ([]Replayed, error) {
	return Replay(ctx, s.cfg.ReplayEndpoint, start, s.cfg.ReplayTimeout)
}

// Replay runs one replay exchange with an engine's replay ROUTER at
// endpoint: every buffered batch from start on, in order, up to the end
// marker, within timeout (2 s when not positive). An empty endpoint
// returns ErrNoReplay.
func Replay(ctx context.Context, endpoint string, start uint64, timeout time.Duration) ([]Replayed, error) {
	if endpoint == "" {
		return nil, ErrNoReplay
	}
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A fresh DEALER per exchange: replies to an earlier request that timed
	// out can never be mistaken for this one's.
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	dealer := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("kvbridge-"+hex.EncodeToString(id))),
		zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(3))
	defer func() { _ = dealer.Close() }()
	if err := dealer.Dial(endpoint); err != nil {
		return nil, fmt.Errorf("vllmzmq: dial replay %s: %w", endpoint, err)
	}
	if err := dealer.Send(zmq4.NewMsgFrom(ReplayRequestFrames(start)...)); err != nil {
		return nil, fmt.Errorf("vllmzmq: send replay request from %d: %w", start, err)
	}
	var got []Replayed
	for {
		msg, err := dealer.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return got, fmt.Errorf("vllmzmq: replay from %d: no end marker within %v (%d batches received): %w",
					start, timeout, len(got), ctx.Err())
			}
			return got, fmt.Errorf("vllmzmq: replay from %d: %w", start, err)
		}
		r, end, err := ParseReplayReply(msg.Frames)
		if err != nil {
			return got, fmt.Errorf("vllmzmq: replay from %d: %w", start, err)
		}
		if end {
			return got, nil
		}
		got = append(got, r)
	}
}

// Close stops the subscriber and waits for its goroutine to exit.
func (s *Subscriber) Close() error {
	s.once.Do(s.cancel)
	<-s.done
	return nil
}
