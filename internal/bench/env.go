package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/multimodal"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
)

// EnvConfig describes an all-in-one kvroute system.
type EnvConfig struct {
	// NATSURL and EtcdEndpoints use running servers; empty starts embedded
	// ones (closed with the Env).
	NATSURL       string
	EtcdEndpoints []string
	// Workers is the number of simulated workers (default 4).
	Workers int
	// Model is the served model (default "Qwen/Qwen3-8B").
	Model string
	// Engine sizes each worker's KV cache and scheduler.
	Engine sim.EngineConfig
	// Speedup divides the workers' simulated step times (default 1).
	Speedup float64
	// LeaseTTL is the workers' etcd lease TTL (default 10 s).
	LeaseTTL time.Duration
	// TokenizerDir, when set, is loaded by the workers (chat template and
	// text prompts as vLLM tokenizes them) and by the router for Model.
	TokenizerDir string
	// ChatTemplate, when set, overrides the tokenizer's chat template for
	// workers and router alike (vLLM's --chat-template).
	ChatTemplate string
	// MMFamily, when set, makes Model a vision-language model of that
	// family for the workers (kvsim expands and keys images) and the router
	// (--mm-model, with uuid injection).
	MMFamily string
	// Mode is the router's first mode (default "kv").
	Mode string
	// NoEvents starts the router without a KV event consumer.
	NoEvents bool
	// NoFallbacks makes the router name only the chosen endpoint in
	// x-gateway-destination-endpoint. An ORIGINAL_DST cluster reads that
	// header as one ip:port, so the original-dst bootstrap needs it.
	NoFallbacks bool
	// Style is the Envoy bootstrap style the gateway runs (default
	// envoy.StyleClusterHeader).
	Style string
	// Bootstrap, when set, is a bootstrap YAML used instead of Style; the
	// workers and the router are patched in as endpoint overrides.
	Bootstrap []byte
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
	// Router, when set, edits the router's configuration before it starts
	// (for example --durable-events).
	Router func(*server.Config)
}

// Env is a running all-in-one system: NATS, etcd, a fleet of simulated
// workers, a kvroute router and the Envoy stand-in in front of it.
type Env struct {
	cfg  EnvConfig
	nats *EmbeddedNATS
	etcd *EmbeddedEtcd
	// Fleet is the simulated workers (fault switches: Kill, ResetCache,
	// DropNextBatches).
	Fleet *sim.Fleet
	// Router is the kvroute instance (Index, Picker, SetMode).
	Router *server.Server
	// Gateway is the Envoy stand-in clients talk to.
	Gateway *envoytest.Gateway
	cancel  context.CancelFunc
	// NATSURL and EtcdEndpoints are the servers in use.
	NATSURL       string
	EtcdEndpoints []string
}

// DefaultModel is the model name the simulated fleet serves by default.
const DefaultModel = sim.DefaultModel

func (c *EnvConfig) defaults() {
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Speedup <= 0 {
		c.Speedup = 1
	}
	if c.Mode == "" {
		c.Mode = "kv"
	}
	if c.Style == "" {
		c.Style = envoy.StyleClusterHeader
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// StartEnv brings the system up and returns once the router sees every
// worker. Close tears it down.
func StartEnv(ctx context.Context, cfg EnvConfig) (_ *Env, err error) {
	cfg.defaults()
	ctx, cancel := context.WithCancel(ctx)
	e := &Env{cfg: cfg, cancel: cancel, NATSURL: cfg.NATSURL, EtcdEndpoints: cfg.EtcdEndpoints}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if e.NATSURL == "" {
		if e.nats, err = StartNATS(); err != nil {
			return nil, err
		}
		e.NATSURL = e.nats.URL()
	}
	if len(e.EtcdEndpoints) == 0 {
		if e.etcd, err = StartEtcd(); err != nil {
			return nil, err
		}
		e.EtcdEndpoints = e.etcd.Endpoints
	}
	wcfg := sim.WorkerConfig{
		Model: cfg.Model, Engine: cfg.Engine, Speedup: cfg.Speedup, LeaseTTL: cfg.LeaseTTL,
		Logger: cfg.Logger.With("component", "kvsim"),
	}
	if cfg.TokenizerDir != "" {
		enc, err := sim.LoadChatEncoder(cfg.TokenizerDir, cfg.ChatTemplate)
		if err != nil {
			return nil, fmt.Errorf("worker tokenizer: %w", err)
		}
		if cfg.MMFamily != "" {
			fam, err := multimodal.ParseFamily(cfg.MMFamily)
			if err != nil {
				return nil, err
			}
			if err := enc.SetMultimodal(fam); err != nil {
				return nil, err
			}
		}
		wcfg.Encoder = enc
	}
	if e.Fleet, err = sim.StartFleet(ctx, sim.FleetConfig{
		Workers: cfg.Workers, Worker: wcfg, NATSURL: e.NATSURL, EtcdEndpoints: e.EtcdEndpoints,
	}); err != nil {
		return nil, fmt.Errorf("start workers: %w", err)
	}
	rcfg := server.DefaultConfig()
	rcfg.GRPCAddr, rcfg.HTTPAddr, rcfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	rcfg.NATSURL, rcfg.EtcdEndpoints = e.NATSURL, e.EtcdEndpoints
	rcfg.KVEvents = !cfg.NoEvents
	rcfg.Scoring.Mode = cfg.Mode
	if cfg.NoFallbacks {
		rcfg.Fallbacks = 0
	}
	rcfg.ShutdownGrace = 2 * time.Second
	rcfg.Logger = cfg.Logger.With("component", "kvroute")
	if cfg.TokenizerDir != "" {
		rcfg.Tokenizers = map[string]tokenizer.ModelSource{cfg.Model: {Dir: cfg.TokenizerDir, ChatTemplate: cfg.ChatTemplate}}
	}
	if cfg.MMFamily != "" {
		fam, err := multimodal.ParseFamily(cfg.MMFamily)
		if err != nil {
			return nil, err
		}
		rcfg.Multimodal = map[string]picker.MultimodalModel{cfg.Model: {Processor: multimodal.DefaultProcessor(fam), InjectUUID: true}}
	}
	if cfg.Router != nil {
		cfg.Router(&rcfg)
	}
	if e.Router, err = server.Start(ctx, rcfg); err != nil {
		return nil, fmt.Errorf("start kvroute: %w", err)
	}
	if err := e.WaitWorkers(ctx, cfg.Workers, 30*time.Second); err != nil {
		return nil, err
	}
	if e.Gateway, err = e.startGateway(ctx); err != nil {
		return nil, fmt.Errorf("start gateway: %w", err)
	}
	return e, nil
}

func (e *Env) startGateway(ctx context.Context) (*envoytest.Gateway, error) {
	var workers []envoy.Worker
	for _, w := range e.Fleet.Workers() {
		rec := w.Record()
		cluster := rec.Cluster
		if cluster == "" {
			cluster = rec.ID // the router writes the id when a record names no cluster
		}
		workers = append(workers, envoy.Worker{Cluster: cluster, Address: w.Addr()})
	}
	if e.cfg.Bootstrap == nil {
		return envoytest.StartGateway(ctx, e.cfg.Style, workers, e.Router.GRPCAddr())
	}
	eps := map[string][]string{envoy.ExtProcClusterName: {e.Router.GRPCAddr()}}
	for _, w := range workers {
		eps[w.Cluster] = []string{w.Address}
	}
	g, err := envoytest.LoadGateway(e.cfg.Bootstrap, envoytest.GatewayOptions{ListenAddress: "127.0.0.1:0", Endpoints: eps})
	if err != nil {
		return nil, err
	}
	if err := g.Start(ctx); err != nil {
		_ = g.Close()
		return nil, err
	}
	return g, nil
}

// URL is the gateway's base URL, where clients send OpenAI requests.
func (e *Env) URL() string { return e.Gateway.URL() }

// RouterURL is the router's HTTP base URL (/metrics, /healthz, /readyz).
func (e *Env) RouterURL() string { return "http://" + e.Router.HTTPAddr() }

// AdminURL is the router's admin listener base URL (/debug/*, /admin/*).
func (e *Env) AdminURL() string { return "http://" + e.Router.AdminAddr() }

// DebugWorkers is the part of the router's /debug/workers this package reads.
type DebugWorkers struct {
	Mode    string `json:"mode"`
	Workers []struct {
		Record struct {
			ID string `json:"id"`
		} `json:"record"`
	} `json:"workers"`
	Index struct {
		Blocks  int `json:"blocks"`
		Entries int `json:"entries"`
	} `json:"index"`
}

// Workers fetches the router's /debug/workers.
func (e *Env) Workers(ctx context.Context) (DebugWorkers, error) {
	var out DebugWorkers
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.AdminURL()+"/debug/workers", nil)
	if err != nil {
		return out, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, fmt.Errorf("router /debug/workers: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("router /debug/workers: %w", err)
	}
	return out, nil
}

// WaitWorkers waits until the router has discovered n workers and is ready.
func (e *Env) WaitWorkers(ctx context.Context, n int, timeout time.Duration) error {
	return poll(ctx, timeout, func() (bool, error) {
		dw, err := e.Workers(ctx)
		return err == nil && e.Router.Ready() && len(dw.Workers) == n, nil
	}, fmt.Sprintf("kvroute to discover %d workers", n))
}

// SetMode switches the router mode through its admin endpoint, as an
// operator would.
func (e *Env) SetMode(ctx context.Context, mode string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.AdminURL()+"/admin/mode?mode="+mode, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("set mode %s: %w", mode, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("set mode %s: %s: %s", mode, resp.Status, body)
	}
	return nil
}

// ResetCaches makes every worker drop its prefix cache and waits until the
// workers are idle and the router's index is empty, so the next run starts
// cold.
func (e *Env) ResetCaches(ctx context.Context) error {
	if err := poll(ctx, 60*time.Second, func() (bool, error) {
		for _, w := range e.Fleet.Workers() {
			if st := w.Stats(); st.Running+st.Waiting > 0 {
				return false, nil
			}
		}
		return true, nil
	}, "workers to finish in-flight requests"); err != nil {
		return err
	}
	for _, w := range e.Fleet.Workers() {
		w.ResetCache()
	}
	if e.cfg.NoEvents {
		return nil
	}
	return poll(ctx, 30*time.Second, func() (bool, error) {
		dw, err := e.Workers(ctx)
		return err == nil && dw.Index.Entries == 0, nil
	}, "the router's index to empty after the cache reset")
}

// Close stops everything StartEnv started, in reverse order.
func (e *Env) Close() {
	if e.Gateway != nil {
		_ = e.Gateway.Close()
	}
	if e.Router != nil {
		_ = e.Router.Shutdown()
	}
	if e.Fleet != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = e.Fleet.Close(ctx)
		cancel()
	}
	e.cancel()
	if e.etcd != nil {
		e.etcd.Close()
	}
	if e.nats != nil {
		e.nats.Close()
	}
}

// poll calls cond every 20 ms until it reports true, fails, ctx ends or
// timeout passes.
func poll(ctx context.Context, timeout time.Duration, cond func() (bool, error), what string) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), fmt.Errorf("waiting for %s", what))
		case <-time.After(20 * time.Millisecond):
		}
	}
}
