package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultLoadInterval is how often a worker publishes its load report.
const DefaultLoadInterval = 200 * time.Millisecond

// WorkerConfig configures one simulated worker. Zero values take defaults.
type WorkerConfig struct {
	// ID names the worker in etcd, NATS subjects and x-target-worker.
	ID string
	// Model is the served model name.
	Model string
	// Engine sizes the KV cache and the scheduler.
	Engine EngineConfig
	// Timing gives each engine step's duration; nil means Polynomial.
	Timing Timing
	// Speedup divides simulated step times (default 1); Jitter and Seed
	// perturb them (see TimingModel).
	Speedup float64
	Jitter  float64
	Seed    uint64
	// ListenAddr is the HTTP listen address (default "127.0.0.1:0").
	ListenAddr string
	// AdvertiseAddr is the ip:port written into the worker record; default
	// the listener's address.
	AdvertiseAddr string
	// Cluster is the Envoy cluster name in the record (default: ID).
	Cluster string
	// Encoder tokenizes text prompts; nil means ByteEncoder.
	Encoder PromptEncoder
	// EOSProbability, when positive, makes each generated token an EOS with
	// this probability for requests without ignore_eos: outputs then end
	// early with finish_reason "stop", deterministically per prompt. Zero
	// (the default) never samples EOS, so every request runs to max_tokens.
	EOSProbability float64
	// DefaultMaxTokens is the output length of a chat request without
	// max_tokens (default 256). Completions default to 16, as in vLLM.
	DefaultMaxTokens int
	// Namespace scopes NATS subjects and etcd keys (default "default").
	Namespace string
	// NATS, when set, receives KV events and load reports.
	NATS *nats.Conn
	// Etcd, when set, holds the worker's leased registration.
	Etcd *clientv3.Client
	// LeaseTTL is the etcd lease TTL (default 10 s).
	LeaseTTL time.Duration
	// EventBatchMax and EventFlushInterval bound a KV event batch; with no
	// interval each engine step's events are published when it ends.
	EventBatchMax      int
	EventFlushInterval time.Duration
	// LoadInterval is the load report period (default 200 ms).
	LoadInterval time.Duration
	// ZMQEndpoint, when set, also publishes KV events as vLLM does on a ZMQ
	// PUB socket bound there (e.g. "tcp://*:5557"), with replay on
	// ZMQReplayEndpoint. DropNextZMQBatches is the one ZMQ fault.
	ZMQEndpoint       string
	ZMQReplayEndpoint string
	ZMQTopic          string
	// DPRank is the data_parallel_rank in records and event batches.
	DPRank int
	// Logger receives the worker's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Worker is one running simulated vLLM worker.
type Worker struct {
	cfg     WorkerConfig
	rec     fleet.Worker
	log     *slog.Logger
	run     *runner
	metrics *workerMetrics
	events  *eventPublisher
	zmq     *vllmzmq.Publisher
	ln      net.Listener
	srv     *http.Server
	reg     *etcd.Registration
	encoder PromptEncoder
	nextID  atomic.Uint64
	created int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	killed atomic.Bool

	// pending collects the engine's events on the loop goroutine.
	pending []vllmwire.Event
}

// StartWorker starts a worker: its engine loop, HTTP server, event and load
// publishers and etcd registration. It runs until ctx ends, Close or Kill.
func StartWorker(ctx context.Context, cfg WorkerConfig) (*Worker, error) {
	if cfg.ID == "" || cfg.Model == "" {
		return nil, errors.New("start worker: ID and Model are required")
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 256
	}
	if cfg.LoadInterval <= 0 {
		cfg.LoadInterval = DefaultLoadInterval
	}
	if cfg.Speedup <= 0 {
		cfg.Speedup = 1
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("worker", cfg.ID)
	w := &Worker{cfg: cfg, log: log, encoder: cfg.Encoder, created: time.Now().Unix()}
	if w.encoder == nil {
		w.encoder = ByteEncoder{}
	}
	var sink EventSink // nobody listens without NATS or ZMQ: skip the conversion
	if cfg.NATS != nil || cfg.ZMQEndpoint != "" {
		sink = EventSinkFunc(func(e Event) { w.pending = append(w.pending, toKVIndex(e)) })
	}
	eng, err := NewEngine(cfg.Engine, sink)
	if err != nil {
		return nil, fmt.Errorf("start worker %s: %w", cfg.ID, err)
	}
	w.cfg.Engine = eng.Config()
	w.run = newRunner(eng, NewTimingModel(cfg.Timing, cfg.Speedup, cfg.Jitter, cfg.Seed))
	w.run.flush = w.flushEvents
	w.metrics = newWorkerMetrics(w.cfg.ID, cfg.Model, w.cfg.Engine, w.run)
	w.ctx, w.cancel = context.WithCancel(ctx)

	if cfg.ZMQEndpoint != "" {
		w.zmq, err = vllmzmq.NewPublisher(w.ctx, vllmzmq.PublisherConfig{
			Endpoint: cfg.ZMQEndpoint, ReplayEndpoint: cfg.ZMQReplayEndpoint,
			Topic: cfg.ZMQTopic, Mode: vllmzmq.Bind, Logger: log,
		})
		if err != nil {
			w.cancel()
			return nil, fmt.Errorf("start worker %s: zmq publisher: %w", cfg.ID, err)
		}
	}
	w.events = newEventPublisher(cfg.NATS, bus.EventsSubject(cfg.Namespace, cfg.ID), w.zmq,
		cfg.DPRank, cfg.EventBatchMax, cfg.EventFlushInterval, log)

	w.ln, err = net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		w.shutdownZMQ()
		w.cancel()
		return nil, fmt.Errorf("start worker %s: listen: %w", cfg.ID, err)
	}
	addr := cfg.AdvertiseAddr
	if addr == "" {
		addr = w.ln.Addr().String()
	}
	w.rec = fleet.Worker{
		ID: cfg.ID, Model: cfg.Model, Address: addr, Cluster: cfg.Cluster,
		BlockSize: w.cfg.Engine.BlockSize, KVTotalBlocks: w.cfg.Engine.NumGPUBlocks,
		MaxNumBatchedTokens: w.cfg.Engine.MaxNumBatchedTokens, MaxNumSeqs: w.cfg.Engine.MaxNumSeqs,
		DPRank: cfg.DPRank,
	}
	if err := discovery.ValidateRecord(w.rec); err != nil {
		_ = w.ln.Close()
		w.shutdownZMQ()
		w.cancel()
		return nil, fmt.Errorf("start worker %s: %w", cfg.ID, err)
	}
	w.srv = &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second}

	w.goRun(func() { w.run.run(w.ctx) })
	w.goRun(func() { w.events.run(w.ctx) })
	if cfg.NATS != nil {
		w.goRun(w.reportLoad)
		// A router whose view of this worker went stale asks for a resync:
		// re-announce the cache on the event stream.
		sub, err := bus.ServeResync(cfg.NATS, cfg.Namespace, cfg.ID, func(req bus.ResyncRequest) error {
			log.Info("resync requested", "router", req.Router, "reason", req.Reason)
			w.Resync()
			return nil
		})
		if err != nil {
			w.Kill()
			return nil, fmt.Errorf("start worker %s: %w", cfg.ID, err)
		}
		w.goRun(func() {
			<-w.ctx.Done()
			_ = sub.Unsubscribe()
		})
	}
	w.goRun(func() {
		if err := w.srv.Serve(w.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	})
	if cfg.Etcd != nil {
		w.reg, err = etcd.Register(w.ctx, cfg.Etcd, cfg.Namespace, w.rec,
			etcd.RegisterOptions{TTL: cfg.LeaseTTL, Logger: log})
		if err != nil {
			w.Kill()
			return nil, fmt.Errorf("start worker %s: %w", cfg.ID, err)
		}
	}
	log.Info("worker started", "addr", addr, "model", cfg.Model,
		"blocks", w.cfg.Engine.NumGPUBlocks, "block_size", w.cfg.Engine.BlockSize)
	return w, nil
}

func (w *Worker) goRun(f func()) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		f()
	}()
}

// flushEvents hands the engine's events to the publisher; loop goroutine.
func (w *Worker) flushEvents() {
	if len(w.pending) == 0 {
		return
	}
	w.events.add(w.pending)
	clear(w.pending)
	w.pending = w.pending[:0]
}

// reportLoad publishes load reports until the worker stops.
func (w *Worker) reportLoad() {
	subject := bus.LoadSubject(w.cfg.Namespace, w.cfg.ID)
	t := time.NewTicker(w.cfg.LoadInterval)
	defer t.Stop()
	for {
		rep := fleet.LoadReport{
			TSMillis:       time.Now().UnixMilli(),
			Waiting:        int(w.run.waiting.Load()),
			Running:        int(w.run.running.Load()),
			KVUsedBlocks:   int(w.run.usedBlocks.Load()),
			KVTotalBlocks:  w.cfg.Engine.NumGPUBlocks,
			KVEventBatches: w.events.numbered.Load(),
		}
		data, _ := json.Marshal(rep) // plain struct of ints: cannot fail
		if err := w.cfg.NATS.Publish(subject, data); err != nil {
			w.log.Warn("publish load report", "err", err)
		}
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ID returns the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Addr returns the HTTP address the worker listens on.
func (w *Worker) Addr() string { return w.ln.Addr().String() }

// URL returns the worker's base URL, e.g. "http://127.0.0.1:8100".
func (w *Worker) URL() string { return "http://" + w.Addr() }

// Record returns the worker's discovery record.
func (w *Worker) Record() fleet.Worker { return w.rec }

// Config returns the worker's configuration with defaults filled in.
func (w *Worker) Config() WorkerConfig { return w.cfg }

// ZMQEndpoint returns the dialable ZMQ PUB endpoint, or "" without ZMQ.
func (w *Worker) ZMQEndpoint() string {
	if w.zmq == nil {
		return ""
	}
	return w.zmq.Endpoint()
}

// ZMQReplayEndpoint returns the dialable ZMQ replay endpoint, or "".
func (w *Worker) ZMQReplayEndpoint() string {
	if w.zmq == nil {
		return ""
	}
	return w.zmq.ReplayEndpoint()
}

// WorkerStats is a snapshot of a worker's state.
type WorkerStats struct {
	Running, Waiting          int
	UsedBlocks, TotalBlocks   int
	PrefixQueries, PrefixHits uint64
	Steps                     uint64
	// EventBatches counts batches published (duplicates once), and
	// DroppedBatches those dropped by the fault switch.
	EventBatches, DroppedBatches uint64
	// Resyncs counts re-announcements of the cache (Resync, NATS reconnects).
	Resyncs uint64
	// ClockLag is the total real time the worker's loop fell behind its
	// simulated clock and skipped to catch up (more than 50 ms at a time):
	// the tokens of those steps came later than the timing model says.
	// Nonzero means the host was too slow for the speedup.
	ClockLag time.Duration
	Killed   bool
}

// Stats returns a snapshot of the worker's state.
func (w *Worker) Stats() WorkerStats {
	return WorkerStats{
		Running: int(w.run.running.Load()), Waiting: int(w.run.waiting.Load()),
		UsedBlocks: int(w.run.usedBlocks.Load()), TotalBlocks: w.cfg.Engine.NumGPUBlocks,
		PrefixQueries: w.run.prefixQueries.Load(), PrefixHits: w.run.prefixHits.Load(),
		Steps: w.run.steps.Load(), EventBatches: w.events.published.Load(),
		DroppedBatches: w.events.dropped.Load(), Resyncs: w.run.resyncs.Load(), Killed: w.killed.Load(),
		ClockLag: time.Duration(w.run.lag.Load()),
	}
}

// ResetCache drops the worker's prefix cache: running requests recompute and
// AllBlocksCleared is published.
func (w *Worker) ResetCache() { w.run.submit(command{kind: cmdReset}) }

// Resync re-announces the worker's whole prefix cache on its event
// streams (AllBlocksCleared, then every cached block), so consumers that
// lost events see the cache as it is. The cache itself is untouched.
func (w *Worker) Resync() { w.run.submit(command{kind: cmdResync}) }

// DropNextBatches makes the next n KV event batches vanish from NATS. Their
// sequence numbers are still used, so consumers see a gap.
func (w *Worker) DropNextBatches(n int) { w.events.dropNext.Add(int64(n)) }

// DropNextZMQBatches keeps the next n KV event batches off the ZMQ PUB
// socket while still numbering them and buffering them for replay, so a
// subscriber sees a gap its replay request can fill.
func (w *Worker) DropNextZMQBatches(n int) { w.events.dropNextZMQ.Add(int64(n)) }

// DuplicateNextBatches publishes each of the next n KV event batches twice
// on NATS with the same sequence number.
func (w *Worker) DuplicateNextBatches(n int) { w.events.dupNext.Add(int64(n)) }

// Kill stops the worker abruptly, as a crash would: the HTTP server and its
// connections close, in-flight requests fail, publishing stops and the etcd
// lease is left to expire (the record disappears after the TTL).
func (w *Worker) Kill() {
	w.once.Do(func() {
		w.killed.Store(true)
		w.log.Warn("worker killed")
		if w.reg != nil {
			w.reg.Abandon()
		}
		w.cancel()
		_ = w.srv.Close()
		w.shutdownZMQ()
		w.wg.Wait()
	})
}

// Close stops the worker cleanly: it deregisters from etcd, stops accepting
// requests, lets in-flight ones finish until ctx ends, then stops.
func (w *Worker) Close(ctx context.Context) error {
	var errs []error
	w.once.Do(func() {
		if w.reg != nil {
			if err := w.reg.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := w.srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("worker %s: http shutdown: %w", w.cfg.ID, err))
			_ = w.srv.Close()
		}
		w.cancel()
		w.shutdownZMQ()
		w.wg.Wait()
		w.log.Info("worker stopped")
	})
	return errors.Join(errs...)
}

func (w *Worker) shutdownZMQ() {
	if w.zmq != nil {
		if err := w.zmq.Close(); err != nil {
			w.log.Debug("close zmq publisher", "err", err)
		}
	}
}
