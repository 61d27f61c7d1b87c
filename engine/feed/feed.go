// Package feed lets the router follow its workers' engines itself, with no
// kvbridge sidecar and no NATS in between: for every worker the fleet holds
// it subscribes to the engine's ZMQ KV-event publisher (engine.Follow, the
// same gap handling as kvbridge's) and delivers the batches, numbered as
// the engine numbered them, to the KV event core (kvevents), and it scrapes
// the engine's /metrics every 250 ms into the scoring pool's load reports.
// With Config.Listen the engines connect instead: one bound SUB socket
// takes every engine's events, and each message's topic names its worker
// (listen.go).
//
// Feeds mirrors the fleet: the server adds it as one more fleet listener,
// so a worker's feeds start when discovery adds it and stop the moment
// discovery removes it.
package feed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvevents"
)

// Defaults for Config.
const (
	DefaultEventsPort     = 5557
	DefaultReplayPort     = 5558
	DefaultScrapeInterval = 250 * time.Millisecond
)

// LoadSink receives the load scraped from engines' /metrics, by worker id.
type LoadSink interface {
	SetLoadReport(worker string, r fleet.LoadReport) error
}

// Config configures Feeds.
type Config struct {
	// Events subscribes to each engine's ZMQ KV events when true.
	Events bool
	// EventsPort is the engine's ZMQ PUB port for data-parallel rank 0;
	// rank r publishes on EventsPort+r, as vLLM does (default 5557). A
	// record's events_endpoint overrides it for that worker.
	EventsPort int
	// ReplayPort is the engine's replay ROUTER port for rank 0 (default
	// 5558); negative: the engines have none, and every gap clears the
	// worker's view. A record's replay_endpoint overrides it for that
	// worker.
	ReplayPort int
	// Topic is the ZMQ subscription filter (vLLM's kv-events-config topic).
	Topic string
	// Listen, when set with Events, binds one ZMQ SUB socket there (e.g.
	// "tcp://0.0.0.0:5557") that every engine connects its PUB socket to,
	// as llm-d deploys vLLM, instead of dialling each engine. Each
	// message's topic, "kv@<ip>[:<port>]@<model>", names its worker
	// (Resolve); each publisher's sequence is checked apart. Replay goes to
	// the record's replay_endpoint, else to the worker's host at ReplayPort
	// when it is > 0; otherwise a gap clears the worker's view.
	Listen string
	// OnUnknownPublisher is called for each batch on Listen whose topic
	// names no single worker (the batch is dropped); nil: only counted in
	// Stats.
	OnUnknownPublisher func()
	// Load scrapes each engine's /metrics into load reports when true.
	Load bool
	// Engine picks the metric names (vllm or sglang; default vllm).
	Engine engine.Engine
	// ScrapeInterval is how often /metrics is read (default 250 ms).
	ScrapeInterval time.Duration
	// Core receives the KV events; required with Events. Each stream waits
	// for Core's hold (a warm start) and resumes after the sequence number
	// a loaded snapshot holds for its worker (kvevents.Core.Resume).
	Core *kvevents.Core
	// Hold, when not nil, is Core's hold: streams start once it is closed.
	Hold <-chan struct{}
	// Pool receives the load reports; required with Load. The router's
	// *scoring.Pool is one.
	Pool LoadSink
	// BlockSize, when not nil, is told when an engine's /metrics states a
	// KV block size (vllm:cache_config_info) other than its worker's
	// record, so the router can take the engine's. It may Upsert the worker
	// again.
	BlockSize func(worker string, engine int) bool
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Feeds runs one engine follower per worker. Its methods are safe for
// concurrent use; Upsert and Remove never block on the network.
type Feeds struct {
	cfg  Config
	ctx  context.Context
	stop context.CancelFunc

	listener *vllmzmq.Listener // nil unless Config.Listen
	gen      atomic.Uint64     // bumped by every Upsert and Remove: topics resolve anew

	mu      sync.Mutex
	workers map[string]*follower
	wg      sync.WaitGroup
	stats   engine.Stats
}

type follower struct {
	spec   fleet.Worker
	ctx    context.Context
	cancel context.CancelFunc
}

// New returns Feeds that run until Close.
func New(cfg Config) (*Feeds, error) {
	if cfg.EventsPort == 0 {
		cfg.EventsPort = DefaultEventsPort
	}
	if cfg.ReplayPort == 0 {
		cfg.ReplayPort = DefaultReplayPort
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = DefaultScrapeInterval
	}
	if cfg.Engine == "" {
		cfg.Engine = engine.EngineVLLM
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if _, err := engine.ParseEngine(string(cfg.Engine)); err != nil {
		return nil, fmt.Errorf("engine feeds: %w", err)
	}
	if cfg.EventsPort < 1 || cfg.EventsPort > 65535 || cfg.ReplayPort > 65535 {
		return nil, fmt.Errorf("engine feeds: events port %d or replay port %d out of range", cfg.EventsPort, cfg.ReplayPort)
	}
	if cfg.Events && cfg.Core == nil {
		return nil, fmt.Errorf("engine feeds: events need the KV event core")
	}
	if cfg.Load && cfg.Pool == nil {
		return nil, fmt.Errorf("engine feeds: load needs a pool")
	}
	ctx, stop := context.WithCancel(context.Background())
	f := &Feeds{cfg: cfg, ctx: ctx, stop: stop, workers: map[string]*follower{}}
	if cfg.Events && cfg.Listen != "" {
		l, err := vllmzmq.Listen(ctx, vllmzmq.ListenerConfig{Endpoint: cfg.Listen, Topic: cfg.Topic, Logger: cfg.Logger})
		if err != nil {
			stop()
			return nil, fmt.Errorf("engine feeds: %w", err)
		}
		f.listener = l
		cfg.Logger.Info("listening for engines' KV events", "endpoint", l.Endpoint())
		f.wg.Add(1)
		go func() { defer f.wg.Done(); defer func() { _ = l.Close() }(); f.demux(l) }()
	}
	return f, nil
}

// ListenEndpoint is the bound KV event listener's address ("tcp://ip:port"),
// empty when not listening.
func (f *Feeds) ListenEndpoint() string {
	if f.listener == nil {
		return ""
	}
	return f.listener.Endpoint()
}

// Stats returns the event streams' counters, summed over every worker.
func (f *Feeds) Stats() *engine.Stats { return &f.stats }

// Upsert starts following a worker's engine, or restarts when its address
// or rank changed.
func (f *Feeds) Upsert(spec fleet.Worker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen.Add(1)
	if f.ctx.Err() != nil {
		return
	}
	if old, ok := f.workers[spec.ID]; ok {
		if old.spec.Address == spec.Address && old.spec.DPRank == spec.DPRank && old.spec.BlockSize == spec.BlockSize &&
			old.spec.EventsEndpoint == spec.EventsEndpoint && old.spec.ReplayEndpoint == spec.ReplayEndpoint {
			old.spec = spec
			return
		}
		old.cancel()
	}
	ctx, cancel := context.WithCancel(f.ctx)
	f.workers[spec.ID] = &follower{spec: spec, ctx: ctx, cancel: cancel}
	if f.cfg.Events && f.listener == nil {
		f.wg.Add(1)
		go func() { defer f.wg.Done(); f.followEvents(ctx, spec) }()
	}
	if f.cfg.Load {
		f.wg.Add(1)
		go func() { defer f.wg.Done(); f.scrapeLoad(ctx, spec) }()
	}
}

// Remove stops following a worker at once.
func (f *Feeds) Remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen.Add(1)
	if w, ok := f.workers[id]; ok {
		w.cancel()
		delete(f.workers, id)
	}
}

// Followed counts the workers being followed.
func (f *Feeds) Followed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.workers)
}

// Close stops every follower and waits for them.
func (f *Feeds) Close() {
	f.mu.Lock()
	f.stop()
	f.workers = map[string]*follower{}
	f.mu.Unlock()
	f.wg.Wait()
}

// endpoint is tcp://host:(port+rank).
func endpoint(address string, port, rank int) (string, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return "", fmt.Errorf("worker address %q: %w", address, err)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+rank)), nil
}

// eventsEndpoint is where the worker's engine publishes: its record's
// events_endpoint, else its host at the fleet-wide port plus its rank.
func (f *Feeds) eventsEndpoint(spec fleet.Worker) (string, error) {
	if spec.EventsEndpoint != "" {
		return spec.EventsEndpoint, nil
	}
	return endpoint(spec.Address, f.cfg.EventsPort, spec.DPRank)
}

// replayEndpoint is the worker's engine's replay socket: its record's
// replay_endpoint, else its host at the fleet-wide replay port plus its
// rank; empty when neither is set (the fleet-wide port is off).
func (f *Feeds) replayEndpoint(spec fleet.Worker) (string, error) {
	if spec.ReplayEndpoint != "" {
		return spec.ReplayEndpoint, nil
	}
	if f.cfg.ReplayPort <= 0 {
		return "", nil
	}
	return endpoint(spec.Address, f.cfg.ReplayPort, spec.DPRank)
}

func (f *Feeds) followEvents(ctx context.Context, spec fleet.Worker) {
	log := f.cfg.Logger.With("worker", spec.ID)
	ep, err := f.eventsEndpoint(spec)
	if err != nil {
		log.Warn("not following KV events", "err", err)
		return
	}
	rep, err := f.replayEndpoint(spec)
	if err != nil {
		log.Warn("not following KV events", "err", err)
		return
	}
	sub, err := vllmzmq.Dial(ctx, vllmzmq.SubscriberConfig{Endpoint: ep, ReplayEndpoint: rep, Topic: f.cfg.Topic, Logger: log.With("endpoint", ep)})
	if err != nil {
		log.Warn("not following KV events", "err", err)
		return
	}
	defer func() { _ = sub.Close() }()
	log.Info("following engine KV events", "endpoint", ep, "replay", rep)
	err = engine.Follow(ctx, f.followConfig(ctx, spec, sub, log))
	if err != nil && ctx.Err() == nil {
		log.Warn("KV event stream ended", "err", err)
	}
}

// followConfig is the stream of one worker's engine: one endpoint is one
// worker, whatever rank its batches name; batches go to the core with the
// engine's numbers, after the core's hold, resuming after a loaded
// snapshot.
func (f *Feeds) followConfig(ctx context.Context, spec fleet.Worker, sub engine.Source, log *slog.Logger) engine.FollowConfig {
	return engine.FollowConfig{
		Sub: sub, Rank: spec.DPRank, WorkerID: func(int) (string, bool) { return spec.ID, true },
		Sink: coreSink{ctx: ctx, core: f.cfg.Core}, Stats: &f.stats, Logger: log, Gate: f.cfg.Hold,
		Resume: func(ctx context.Context) (uint64, bool) { return f.cfg.Core.Resume(ctx, spec.ID) },
	}
}

// coreSink delivers a stream's batches to the KV event core, which applies
// them with the same rules as batches from NATS; the stream has already
// healed what the engine's replay socket could heal, and its Clear is a
// kvevents Reset.
type coreSink struct {
	ctx  context.Context
	core *kvevents.Core
}

func (s coreSink) Connected() bool { return true }

func (s coreSink) Publish(worker string, seq uint64, payload []byte) error {
	return s.deliver(kvevents.Delivery{Worker: worker, Seq: seq, Payload: payload})
}

func (s coreSink) Clear(worker string, _ int) error {
	return s.deliver(kvevents.Delivery{Worker: worker, Reset: true})
}

// deliver hands d to the core. A stream that is ending (its worker removed,
// the router stopping) drops the batch quietly: nobody will read it.
func (s coreSink) deliver(d kvevents.Delivery) error {
	err := s.core.Deliver(s.ctx, d)
	if err != nil && (s.ctx.Err() != nil || errors.Is(err, kvevents.ErrStopped)) {
		return nil //nolint:nilerr // stopping: the batch is not lost, the stream ends
	}
	return err
}
