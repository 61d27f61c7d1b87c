package feed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/fleet"
)

// Errors of Resolve.
var (
	ErrUnknownPublisher   = errors.New("no worker matches the publisher's topic")
	ErrAmbiguousPublisher = errors.New("more than one worker matches the publisher's topic")
)

// Resolve names the worker a publisher's topic stands for:
// "kv@<host>[:<port>]@<model>" matches the workers whose address has that
// host (and port, when the topic has one); when several do, the topic's
// model picks among them. Anything else is unknown or ambiguous: a
// listener's batches must never land on a guessed worker.
func Resolve(topic string, workers []fleet.Worker) (fleet.Worker, error) {
	t, err := vllmzmq.ParseTopic(topic)
	if err != nil {
		return fleet.Worker{}, fmt.Errorf("%w: %w", ErrUnknownPublisher, err)
	}
	var hits []fleet.Worker
	for _, w := range workers {
		host, port, err := net.SplitHostPort(w.Address)
		if err != nil || host != t.Host || (t.Port != 0 && port != strconv.Itoa(t.Port)) {
			continue
		}
		hits = append(hits, w)
	}
	if len(hits) > 1 && t.Model != "" {
		same := hits[:0:0]
		for _, w := range hits {
			if w.Model == t.Model {
				same = append(same, w)
			}
		}
		hits = same
	}
	switch len(hits) {
	case 0:
		return fleet.Worker{}, fmt.Errorf("%w %q", ErrUnknownPublisher, topic)
	case 1:
		return hits[0], nil
	}
	return fleet.Worker{}, fmt.Errorf("%w %q (%d workers); name the engine's port in it: kv@<ip>:<port>@<model>", ErrAmbiguousPublisher, topic, len(hits))
}

// publisher is one engine's share of the listener: the batches whose topic
// resolved to its worker, in arrival order, for a stream of its own, so
// that each publisher's sequence numbers are checked apart from the rest.
type publisher struct {
	worker string
	ch     chan vllmzmq.Event
	ctx    context.Context // the worker's follower context: ends when discovery drops it
	replay string          // the engine's replay endpoint; empty: none
}

func (p *publisher) Recv(ctx context.Context) (vllmzmq.Event, error) {
	select {
	case ev := <-p.ch:
		return ev, nil
	case <-ctx.Done():
		return vllmzmq.Event{}, ctx.Err()
	}
}

func (p *publisher) Replay(ctx context.Context, start uint64) ([]vllmzmq.Replayed, error) {
	return vllmzmq.Replay(ctx, p.replay, start, 0)
}

// maxLoggedTopics bounds the unknown topics logged one by one; past it
// they are only counted. maxUnknownTopics bounds the topics remembered as
// resolving to no worker (so a chatty stray publisher costs a map lookup
// per batch, not a pass over the fleet) until the fleet changes.
const (
	maxLoggedTopics  = 64
	maxUnknownTopics = 4096
)

// demux owns the listener's receive loop and the publishers by topic; only
// its goroutine touches pubs and logged.
func (f *Feeds) demux(l *vllmzmq.Listener) {
	pubs := map[string]*publisher{}
	logged := map[string]bool{}
	unknown := map[string]uint64{} // topic -> fleet generation it failed to resolve in
	for {
		ev, err := l.Recv(f.ctx)
		if err != nil {
			if f.ctx.Err() != nil {
				return
			}
			if errors.Is(err, vllmzmq.ErrBadFrames) {
				f.stats.Malformed.Add(1)
				continue
			}
			f.cfg.Logger.Warn("KV event listener stopped", "err", err)
			return
		}
		p := pubs[ev.Topic]
		if p == nil || p.ctx.Err() != nil {
			gen := f.gen.Load()
			if g, ok := unknown[ev.Topic]; ok && g == gen {
				p = nil
			} else {
				p = f.startPublisher(ev.Topic)
			}
			if p == nil {
				if len(unknown) >= maxUnknownTopics {
					clear(unknown)
				}
				unknown[ev.Topic] = gen
				f.stats.UnknownPublisher.Add(1)
				if f.cfg.OnUnknownPublisher != nil {
					f.cfg.OnUnknownPublisher()
				}
				if !logged[ev.Topic] && len(logged) < maxLoggedTopics {
					logged[ev.Topic] = true
					_, rerr := Resolve(ev.Topic, f.specs())
					f.cfg.Logger.Warn("dropping KV events from a publisher no worker matches", "topic", ev.Topic, "err", rerr)
				}
				delete(pubs, ev.Topic)
				continue
			}
			pubs[ev.Topic] = p
			delete(logged, ev.Topic)
			delete(unknown, ev.Topic)
		}
		select {
		case p.ch <- ev:
		case <-p.ctx.Done():
		case <-f.ctx.Done():
			return
		}
	}
}

// specs copies the followed workers' records.
func (f *Feeds) specs() []fleet.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]fleet.Worker, 0, len(f.workers))
	for _, w := range f.workers {
		out = append(out, w.spec)
	}
	return out
}

// startPublisher resolves a topic to a followed worker and starts the
// stream for its batches, which ends with the worker's follower; nil when
// no single worker matches.
func (f *Feeds) startPublisher(topic string) *publisher {
	f.mu.Lock()
	defer f.mu.Unlock()
	specs := make([]fleet.Worker, 0, len(f.workers))
	for _, w := range f.workers {
		specs = append(specs, w.spec)
	}
	spec, err := Resolve(topic, specs)
	if err != nil {
		return nil
	}
	w := f.workers[spec.ID]
	p := &publisher{worker: spec.ID, ch: make(chan vllmzmq.Event, 1024), ctx: w.ctx}
	p.replay, _ = f.replayEndpoint(spec)
	log := f.cfg.Logger.With("worker", spec.ID, "topic", topic)
	log.Info("following a publisher on the KV event listener", "replay", p.replay)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		err := engine.Follow(p.ctx, f.followConfig(p.ctx, spec, p, log))
		if err != nil && p.ctx.Err() == nil {
			log.Warn("KV event stream ended", "err", err)
		}
	}()
	return p
}
