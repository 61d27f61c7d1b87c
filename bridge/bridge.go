// Package bridge brings a stock vLLM or SGLang engine into a kvroute fleet
// without changing the engine: it subscribes to the engine's ZMQ KV events
// and republishes them unchanged on NATS (healing sequence gaps through the
// engine's replay socket, clearing the worker's view when that cannot be
// done), turns the engine's Prometheus gauges into load reports, and keeps
// the worker registered in etcd under a lease while the engine is healthy.
//
// It is the library behind cmd/kvbridge, so tests and demos can run a bridge
// in-process.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/fleet"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults for Config.
const (
	DefaultScrapeInterval = 250 * time.Millisecond
	DefaultUnhealthyAfter = 3 * time.Second
	DefaultReadyPoll      = 500 * time.Millisecond
	DefaultSettleDelay    = 500 * time.Millisecond
)

// Config configures a Bridge.
type Config struct {
	// Namespace is the kvroute namespace (NATS subjects and etcd keys).
	Namespace string
	// WorkerID names the worker. With more than one data-parallel rank each
	// rank is its own worker "<WorkerID>-dp<rank>".
	WorkerID string
	// Engine is vllm or sglang; it picks the metric names.
	Engine engine.Engine
	// EngineURL is the engine's HTTP server, e.g. "http://127.0.0.1:8000".
	EngineURL string
	// EventsEndpoint is the engine's ZMQ PUB endpoint for rank 0, e.g.
	// "tcp://127.0.0.1:5557"; rank r's port is offset by r, as the engine
	// does.
	EventsEndpoint string
	// EventsListen, when set, replaces EventsEndpoint: the bridge binds a
	// SUB socket there (e.g. "tcp://0.0.0.0:5557") and the engine connects
	// its PUB socket to it, as llm-d deploys vLLM (kv-events-config endpoint
	// "tcp://<bridge>:5557"). Rank r listens on the port offset by r. Only
	// this engine's batches are taken: topics "kv@<host>[:port]@<model>"
	// must name Address's host (and port); topics in other forms are taken
	// as the engine's.
	EventsListen string
	// ReplayEndpoint is the engine's replay ROUTER for rank 0; empty means
	// the engine has none, and every gap clears the worker's view.
	ReplayEndpoint string
	// Topic is the ZMQ subscription filter (vLLM's kv-events-config topic).
	Topic string
	// DPSize is the number of data-parallel ranks (default 1).
	DPSize int
	// Address is the "ip:port" the router sends requests to.
	Address string
	// Cluster is the Envoy cluster name; empty means the worker id.
	Cluster string
	// BlockSize overrides the KV block size the engine reports (vLLM's
	// cache_config_info, SGLang's page_size).
	BlockSize int
	// KVTotalBlocks overrides the KV capacity in blocks the engine reports.
	KVTotalBlocks int
	// MaxNumSeqs and MaxNumBatchedTokens are copied into the registration.
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	// Weight is the worker's relative capacity (0 means 1).
	Weight float64
	// ScrapeInterval is how often /metrics is read and a load report sent.
	ScrapeInterval time.Duration
	// UnhealthyAfter is how long /metrics may fail before the worker is
	// deregistered; it registers again once /health and /v1/models answer.
	UnhealthyAfter time.Duration
	// LeaseTTL is the etcd lease TTL (default discovery's).
	LeaseTTL time.Duration
	// SettleDelay is how long after the first registration KV events start
	// to flow, so that routers watching etcd know the worker before its
	// first batch (they drop batches of unknown workers). Until then the
	// engine's batches wait in its socket and replay buffer. Default 500 ms;
	// negative means no wait.
	SettleDelay time.Duration
	// ReplayTimeout bounds one replay exchange (default 2 s).
	ReplayTimeout time.Duration
	// HTTPTimeout bounds each request to the engine (default 2 s).
	HTTPTimeout time.Duration
	// NATS carries events and load reports. Required.
	NATS *nats.Conn
	// Etcd holds registrations; nil runs without registering.
	Etcd *clientv3.Client
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	if c.ScrapeInterval <= 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.UnhealthyAfter <= 0 {
		c.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if c.SettleDelay == 0 {
		c.SettleDelay = DefaultSettleDelay
	}
	if c.HTTPTimeout <= 0 {
		c.HTTPTimeout = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Engine == "" {
		c.Engine = engine.EngineVLLM
	}
	var errs []error
	if _, err := engine.ParseEngine(string(c.Engine)); err != nil {
		errs = append(errs, err)
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace is empty"))
	}
	if c.WorkerID == "" {
		errs = append(errs, errors.New("worker id is empty"))
	} else if strings.ContainsAny(c.WorkerID, "/ \t\n.*>") {
		errs = append(errs, fmt.Errorf("worker id %q contains a character not allowed in etcd keys or NATS subjects", c.WorkerID))
	}
	if c.EngineURL == "" {
		errs = append(errs, errors.New("engine URL is empty"))
	}
	if c.EventsEndpoint == "" && c.EventsListen == "" {
		errs = append(errs, errors.New("events endpoint is empty"))
	}
	if c.DPSize < 1 {
		errs = append(errs, fmt.Errorf("data-parallel size %d must be at least 1", c.DPSize))
	}
	if c.Etcd != nil {
		if _, port, err := net.SplitHostPort(c.Address); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("address %q is not ip:port", c.Address))
		}
	}
	if c.NATS == nil {
		errs = append(errs, errors.New("no NATS connection"))
	}
	if c.BlockSize < 0 || c.KVTotalBlocks < 0 {
		errs = append(errs, errors.New("block size and KV capacity must not be negative"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("bridge config: %w", errors.Join(errs...))
	}
	return nil
}

// Bridge runs one engine's sidecar duties. Create it with New, then Run.
type Bridge struct {
	cfg    Config
	log    *slog.Logger
	engine *engine.Client
	events *natsEvents
	stats  engine.Stats

	// forwarding is closed once the worker is registered and settled;
	// streams hold their batches until then.
	forwarding chan struct{}

	mu         sync.Mutex
	streams    []*engine.Stream
	registered []*etcd.Registration
	records    []fleet.Worker
}

// New validates cfg and returns a bridge.
func New(cfg Config) (*Bridge, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Bridge{
		cfg:        cfg,
		log:        cfg.Logger,
		engine:     engine.NewClient(cfg.EngineURL, cfg.Engine, cfg.HTTPTimeout),
		events:     newNATSEvents(cfg.NATS, cfg.Namespace),
		forwarding: make(chan struct{}),
	}, nil
}

// Stats returns the bridge's counters.
func (b *Bridge) Stats() *engine.Stats { return &b.stats }

// WorkerID returns the worker id of a data-parallel rank, and false for a
// rank outside the configured size.
func (b *Bridge) WorkerID(rank int) (string, bool) {
	if rank < 0 || rank >= b.cfg.DPSize {
		return "", false
	}
	if b.cfg.DPSize == 1 {
		return b.cfg.WorkerID, true
	}
	return fmt.Sprintf("%s-dp%d", b.cfg.WorkerID, rank), true
}

// Records returns the records currently registered (empty while the engine
// is not ready or unhealthy).
func (b *Bridge) Records() []fleet.Worker {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]fleet.Worker(nil), b.records...)
}

// Resync makes every stream publish AllBlocksCleared and republish what the
// engine still buffers, rebuilding the routers' view of the workers. Call it
// when batches may have been lost downstream, e.g. after the NATS connection
// came back (routers that missed batches see a sequence gap and hold the
// worker stale until such a resync).
func (b *Bridge) Resync() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.streams {
		s.RequestResync()
	}
}

// Run forwards events, reports load and keeps the registration until ctx
// ends, then deregisters (the SIGTERM path) and returns nil. It returns an
// error only for a failure it cannot ride out.
func (b *Bridge) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	streams := make([]*engine.Stream, b.cfg.DPSize)
	for r := range streams {
		sub, closeSub, err := b.source(ctx, r)
		if err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		defer func() { _ = closeSub() }()
		streams[r] = engine.NewStream(engine.FollowConfig{Sub: sub, Rank: r, WorkerID: b.WorkerID,
			Sink: b.events, Stats: &b.stats, Logger: b.log, Gate: b.forwarding})
	}

	b.mu.Lock()
	b.streams = streams
	b.mu.Unlock()
	// Routers whose view of a rank went stale (a lost batch) ask for a
	// resync on the NATS request subject; the stream replays from the
	// engine's replay socket after AllBlocksCleared.
	for r, s := range streams {
		id, ok := b.WorkerID(r)
		if !ok {
			continue
		}
		rs, err := bus.ServeResync(b.cfg.NATS, b.cfg.Namespace, id, func(req bus.ResyncRequest) error {
			b.log.Info("resync requested", "worker", id, "router", req.Router, "reason", req.Reason)
			s.RequestResync()
			return nil
		})
		if err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		defer func() { _ = rs.Unsubscribe() }()
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(streams)+1)
	for _, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Run(ctx); err != nil {
				errc <- err
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		b.superviseEngine(ctx, streams)
	}()

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		cancel()
	}
	wg.Wait()
	b.deregister()
	if err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	return nil
}
