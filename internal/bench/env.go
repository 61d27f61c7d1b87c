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
	"github.com/kvroute/kvroute/envoy/proxy"
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
	// Timing gives the workers' step times; nil means sim.Polynomial.
	Timing sim.Timing
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
	// Style is the Envoy bootstrap style Envoy runs (default
	// envoy.StyleClusterHeader). The xds style also starts the router's
	// ADS server.
	Style string
	// EnvoyLog receives Envoy's own log; nil keeps only its tail, which
	// start-up errors quote.
	EnvoyLog io.Writer
	// EnvoyTLS makes Envoy dial the router's ext_proc over TLS; the router
	// needs the matching server.Config.TLS (set it through Router).
	EnvoyTLS *envoy.TLSFiles
	// ResponsePath is what of each response Envoy shows the router
	// (envoy.Options.ResponsePath; default the observed response path).
	ResponsePath string
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
	// Router, when set, edits the router's configuration before it starts
	// (for example --durable-events).
	Router func(*server.Config)
	// ResponseWorkerHeader makes responses name their worker in
	// x-kvroute-worker (kvroute --response-worker-header).
	ResponseWorkerHeader bool
}

// Env is a running all-in-one system: NATS, etcd, a fleet of simulated
// workers, a kvroute router and a real Envoy in front of it.
type Env struct {
	cfg  EnvConfig
	nats *EmbeddedNATS
	etcd *EmbeddedEtcd
	// Fleet is the simulated workers (fault switches: Kill, ResetCache,
	// DropNextBatches).
	Fleet *sim.Fleet
	// Router is the kvroute instance (Index, Picker, SetMode).
	Router *server.Server
	// Envoy is the Envoy process clients talk to.
	Envoy  *proxy.Proxy
	cancel context.CancelFunc
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
		c.Logger = slog.New(slog.DiscardHandler)
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
		Model: cfg.Model, Engine: cfg.Engine, Timing: cfg.Timing, Speedup: cfg.Speedup, LeaseTTL: cfg.LeaseTTL,
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
	if cfg.Style == envoy.StyleXDS {
		rcfg.XDSAddr = "127.0.0.1:0"
	}
	rcfg.Stream.ResponseWorkerHeader = cfg.ResponseWorkerHeader
	if cfg.Router != nil {
		cfg.Router(&rcfg)
	}
	if e.Router, err = server.Start(ctx, rcfg); err != nil {
		return nil, fmt.Errorf("start kvroute: %w", err)
	}
	if err := e.WaitWorkers(ctx, cfg.Workers, 30*time.Second); err != nil {
		return nil, err
	}
	if e.Envoy, err = StartEnvoy(ctx, EnvoyConfig{
		Style: cfg.Style, Workers: e.EnvoyWorkers(), ExtProcAddr: e.Router.GRPCAddr(),
		XDSAddr: e.xdsAddr(), TLS: cfg.EnvoyTLS, Log: cfg.EnvoyLog, ResponsePath: cfg.ResponsePath,
	}); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Env) xdsAddr() string {
	if e.cfg.Style != envoy.StyleXDS {
		return ""
	}
	return e.Router.XDSAddr()
}

// EnvoyWorkers lists the fleet as the cluster-header bootstrap names it.
func (e *Env) EnvoyWorkers() []envoy.Worker {
	var workers []envoy.Worker
	for _, w := range e.Fleet.Workers() {
		rec := w.Record()
		cluster := rec.Cluster
		if cluster == "" {
			cluster = rec.ID // the router writes the id when a record names no cluster
		}
		workers = append(workers, envoy.Worker{Cluster: cluster, Address: w.Addr()})
	}
	return workers
}

// EnvoyConfig is one Envoy in front of a router.
type EnvoyConfig struct {
	// Style is the bootstrap style (envoy.Styles).
	Style string
	// Workers are the cluster-header style's workers.
	Workers []envoy.Worker
	// ExtProcAddr is the router's ext_proc address, XDSAddr its ADS
	// address (style xds).
	ExtProcAddr, XDSAddr string
	// TLS, when set, is Envoy's side of TLS to the router's ext_proc.
	TLS *envoy.TLSFiles
	// ResponsePath is envoy.Options.ResponsePath (default: the observed
	// response path).
	ResponsePath string
	// Edit, when set, changes the generated bootstrap before Envoy loads it.
	Edit func([]byte) ([]byte, error)
	// Log receives Envoy's own log.
	Log io.Writer
}

// StartEnvoy renders the bootstrap of a style (kvroute envoy-config) with
// free loopback ports and runs the real Envoy on it (proxy.Find locates the
// binary) until ctx ends or the proxy is closed.
func StartEnvoy(ctx context.Context, c EnvoyConfig) (*proxy.Proxy, error) {
	data, err := envoy.Generate(c.Style, c.Workers, envoy.Options{
		ListenAddress: "127.0.0.1:0", AdminAddress: "127.0.0.1:0",
		ExtProcAddress: c.ExtProcAddr, XDSAddress: c.XDSAddr, ExtProcTLS: c.TLS, ResponsePath: c.ResponsePath,
	})
	if err != nil {
		return nil, err
	}
	if c.Edit != nil {
		if data, err = c.Edit(data); err != nil {
			return nil, err
		}
	}
	p, err := proxy.Start(ctx, proxy.Config{Bootstrap: data, Listener: "llm", Log: c.Log})
	if err != nil {
		return nil, fmt.Errorf("start envoy: %w", err)
	}
	return p, nil
}

// URL is Envoy's base URL, where clients send OpenAI requests.
func (e *Env) URL() string { return e.Envoy.URL() }

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

// Workers fetches the router's /debug/workers?verbose=1 (every worker's whole record).
func (e *Env) Workers(ctx context.Context) (DebugWorkers, error) {
	var out DebugWorkers
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.AdminURL()+"/debug/workers?verbose=1", nil)
	if err != nil {
		return out, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, fmt.Errorf("router /debug/workers: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
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
	defer func() { _ = resp.Body.Close() }()
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
	if e.Envoy != nil {
		_ = e.Envoy.Close()
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
