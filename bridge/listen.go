package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/engine/vllmzmq"
)

// TopicMatches reports whether a publisher's topic names the engine at
// address ("ip:port"): a "kv@<host>[:<port>]@<model>" topic whose host is
// address's host and whose port, when it has one, is address's port. A
// topic in another form (vLLM's default is empty) names nobody in
// particular; ok is false for it and the caller decides.
func TopicMatches(topic, address string) (match, ok bool) {
	t, err := vllmzmq.ParseTopic(topic)
	if err != nil {
		return false, false
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return false, true
	}
	if t.Host != host {
		return false, true
	}
	return t.Port == 0 || strconv.Itoa(t.Port) == port, true
}

// ownEngine lets through only the batches of the one engine a bridge sits
// beside when it listens instead of dialling: topics that name its
// advertised address, or that name nobody (one engine per listener is the
// deployment). Another engine connecting by mistake is counted and logged
// once per topic, and its batches dropped, so its sequence numbers never
// mix with the engine's.
type ownEngine struct {
	src     engine.Source
	address string
	stats   *engine.Stats
	log     *slog.Logger

	mu     sync.Mutex
	logged map[string]bool
}

func (o *ownEngine) Recv(ctx context.Context) (vllmzmq.Event, error) {
	for {
		ev, err := o.src.Recv(ctx)
		if err != nil {
			return ev, err
		}
		if match, named := TopicMatches(ev.Topic, o.address); match || !named {
			return ev, nil
		}
		o.stats.UnknownPublisher.Add(1)
		o.mu.Lock()
		if !o.logged[ev.Topic] && len(o.logged) < 64 {
			o.logged[ev.Topic] = true
			o.log.Warn("dropping KV events from a publisher that is not this bridge's engine", "topic", ev.Topic, "engine", o.address)
		}
		o.mu.Unlock()
	}
}

func (o *ownEngine) Replay(ctx context.Context, start uint64) ([]vllmzmq.Replayed, error) {
	return o.src.Replay(ctx, start)
}

// source opens rank r's event source: a subscriber dialled to the engine's
// PUB socket, or, with EventsListen, a bound SUB socket the engine's PUB
// connects to.
func (b *Bridge) source(ctx context.Context, r int) (engine.Source, func() error, error) {
	rep, err := vllmzmq.OffsetEndpointPort(b.cfg.ReplayEndpoint, r)
	if err != nil {
		return nil, nil, err
	}
	if b.cfg.EventsListen != "" {
		ep, err := vllmzmq.OffsetEndpointPort(b.cfg.EventsListen, r)
		if err != nil {
			return nil, nil, err
		}
		l, err := vllmzmq.Listen(ctx, vllmzmq.ListenerConfig{
			Endpoint: ep, Topic: b.cfg.Topic, ReplayEndpoint: rep,
			ReplayTimeout: b.cfg.ReplayTimeout, Logger: b.log.With("listen", ep),
		})
		if err != nil {
			return nil, nil, fmt.Errorf("listen for rank %d: %w", r, err)
		}
		b.log.Info("listening for the engine's KV events", "endpoint", l.Endpoint(), "dp_rank", r)
		return &ownEngine{src: l, address: b.cfg.Address, stats: &b.stats, log: b.log, logged: map[string]bool{}}, l.Close, nil
	}
	ep, err := vllmzmq.OffsetEndpointPort(b.cfg.EventsEndpoint, r)
	if err != nil {
		return nil, nil, err
	}
	sub, err := vllmzmq.Dial(ctx, vllmzmq.SubscriberConfig{
		Endpoint: ep, ReplayEndpoint: rep, Topic: b.cfg.Topic,
		ReplayTimeout: b.cfg.ReplayTimeout, Logger: b.log.With("endpoint", ep),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("subscribe rank %d: %w", r, err)
	}
	return sub, sub.Close, nil
}
