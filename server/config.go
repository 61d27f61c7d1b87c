// Package server runs a whole kvroute instance in-process: the ext_proc
// gRPC server, the Picker with its KV index, tokenizers and scoring router,
// worker discovery (etcd or a static file), the NATS consumers (KV events,
// load reports, replica sync) with an embedded NATS server when none is
// given, and the HTTP side (/metrics, /healthz, /readyz, /debug/*,
// /admin/mode). cmd/kvroute is a thin flag layer over Run; tests and
// kvbench start routers with Start.
package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is everything a router instance needs. Start from DefaultConfig.
type Config struct {
	// Namespace scopes etcd keys and NATS subjects (default "default").
	Namespace string
	// GRPCAddr is the ext_proc listen address (default ":9002").
	GRPCAddr string
	// HTTPAddr serves /metrics, /healthz and /readyz (default ":9090");
	// "-" disables it.
	HTTPAddr string
	// AdminAddr serves /debug/* and /admin/* (default "127.0.0.1:9091",
	// loopback only); "-" or "" disables it.
	AdminAddr string
	// RenderAddr serves vLLM's render API (POST /v1/completions/render and
	// /v1/chat/completions/render) from the router's tokenizers, for
	// engines that tokenize through a render service
	// (llm-d-inference-sim --render-url); "" or "-" disables it (default).
	RenderAddr string
	// AdminToken, when set, is the bearer token the admin listener
	// requires (Authorization: Bearer <token>). Never logged.
	AdminToken string

	// NATSURL is the NATS server to use; empty starts an embedded one on
	// EmbeddedNATSAddr.
	NATSURL string
	// NATSCredsFile is a NATS credentials file (JWT and NKey seed, as `nsc`
	// writes it) used to connect to NATSURL; empty: none.
	NATSCredsFile string
	// NATSUser and NATSPassword authenticate to NATSURL with a user and
	// password; NATSNKeySeedFile with an NKey (a seed file, as `nk -gen
	// user` writes it). Never logged.
	NATSUser, NATSPassword string
	NATSNKeySeedFile       string
	// NATSTLS is the client TLS for NATSURL (CA, optional client
	// certificate), or nil.
	NATSTLS *tls.Config
	// EmbeddedNATSAddr is where the embedded NATS server listens (default
	// "127.0.0.1:4222"; port 0 picks a free one).
	EmbeddedNATSAddr string

	// EtcdEndpoints, when set, discover workers from etcd.
	EtcdEndpoints []string
	// EtcdUsername and EtcdPassword authenticate to etcd.
	EtcdUsername, EtcdPassword string
	// EtcdTLS is the client TLS for etcd, or nil.
	EtcdTLS *tls.Config
	// WorkersFile is the static YAML/JSON fleet, used when there is no etcd.
	WorkersFile string
	// WorkersFileInterval is how often WorkersFile is checked (default 2 s).
	WorkersFileInterval time.Duration
	// AllowAddressRanges accepts worker addresses in these ranges although
	// they are link-local or metadata addresses, which are refused by
	// default (--allow-address-ranges).
	AllowAddressRanges []netip.Prefix

	// PoolName, when set, discovers workers from the Gateway API Inference
	// Extension InferencePool of that name in PoolNamespace (GIE's
	// --pool-name/--pool-namespace): its selector's Ready pods, one worker
	// per target port (discovery/kubepool).
	PoolName string
	// PoolNamespace is the InferencePool's namespace (default "default").
	PoolNamespace string
	// Kubeconfig reaches the API server from outside a cluster; empty uses
	// the in-cluster service account.
	Kubeconfig string
	// PoolDefaults fill what pod annotations do not say (model, block size,
	// KV capacity).
	PoolDefaults kubepool.Defaults
	// EngineEvents is where KV events come from: "nats" (the default;
	// kvbridge or kvsim publish them) or "zmq", subscribing to every
	// worker's engine directly (engine/feed).
	EngineEvents string
	// EngineEventsPort and EngineReplayPort are the engines' ZMQ publisher
	// and replay ports for rank 0 with EngineEvents "zmq" (defaults 5557 and
	// 5558; a negative replay port: none).
	EngineEventsPort, EngineReplayPort int
	// EngineEventsTopic is the ZMQ subscription filter ("" takes all).
	EngineEventsTopic string
	// EngineEventsListen, with EngineEvents "zmq", binds one ZMQ SUB socket
	// there (e.g. "tcp://0.0.0.0:5557") that every engine's PUB socket
	// connects to, instead of dialling each engine; topics
	// "kv@<ip>[:<port>]@<model>" name the workers (feed.Resolve).
	// EngineReplayPort > 0 still asks each worker's host for replay.
	EngineEventsListen string
	// EngineLoad is where load reports come from: "nats" (the default) or
	// "scrape", reading every worker's /metrics each 250 ms.
	EngineLoad string
	// Engine names the engines' metric dialect for EngineLoad "scrape":
	// "vllm" (default) or "sglang".
	Engine string

	// XDSAddr, when set, serves the discovered workers to Envoy over ADS
	// there: one cluster per worker (fleet.Worker.ClusterName, its address), for
	// the xds bootstrap style (`kvroute envoy-config --style xds`).
	XDSAddr string
	// XDSNodeID restricts the ADS answers to the Envoy with this node id;
	// empty answers every Envoy.
	XDSNodeID string

	// Tokenizers maps a served model (or adapter) name to its tokenizer
	// folder and, optionally, a chat template that replaces the folder's
	// own, as vLLM's --chat-template. Every one is loaded at Start; a
	// model without one is routed by load.
	Tokenizers map[string]tokenizer.ModelSource
	// Scoring configures modes, cost and the admission queue.
	Scoring scoring.Options
	// KVEvents consumes KV events; false makes "kv" use the approximate
	// index (kv_without_events) and starts no consumer.
	KVEvents bool
	// BlockSize, when positive, overrides the workers' block size.
	BlockSize int
	// Stream shapes ext_proc answers (target header, body limit, debug
	// headers).
	Stream extproc.Config
	// RequestLogSize is how many recent decisions /debug/requests keeps,
	// each with its explanation and outcome (0: off).
	RequestLogSize int
	// Fallbacks is how many next-best endpoints follow the primary in
	// x-gateway-destination-endpoint and its envoy.lb metadata (default 2).
	//
	// The endpoint picker protocol allows a list there and requires header
	// and metadata to be identical, and Gateway API data planes use the
	// fallbacks, so the default keeps the protocol. Plain Envoy's
	// ORIGINAL_DST cluster with use_http_header (envoy/original-dst.yaml)
	// reads the header as one ip:port and answers a list with 503 "no
	// healthy upstream": operators of that bootstrap set 0. We keep the
	// two values identical instead of sending the primary alone in the
	// header, because a data plane that reads the header for its fallbacks
	// would otherwise silently lose them.
	Fallbacks int
	// OnBadBody decides between 400 and routing by load.
	OnBadBody picker.BadBodyPolicy
	// ModelHeader carries the model in body mode NONE (optional).
	ModelHeader string
	// Multimodal declares vision-language models (served or base model
	// name → processor, uuid injection): their image chats are placed and
	// hashed with each image's identity (--mm-model, --mm-inject-uuid).
	Multimodal map[string]picker.MultimodalModel
	// TLS serves ext_proc over TLS (mTLS when it verifies clients).
	TLS *tls.Config
	// KeepaliveMinTime is the shortest client ping interval tolerated on the
	// ext_proc server (default 1 s).
	KeepaliveMinTime time.Duration
	// IndexJumpSearch sets kvindex.Config.JumpSearch, which changes
	// nothing: the index reads long prompts in chains (docs/index-peers.md).
	// Kept so that configurations naming it still start.
	IndexJumpSearch bool
	// IndexGrowTables lets the KV index grow each worker's table of
	// engine hashes as its cache fills, instead of sizing it once for the
	// capacity a worker's record or its engine's load reports state.
	IndexGrowTables bool
	// MaxMessages and MaxPromptBytes cap what a decision renders and
	// tokenizes; above a cap the request is routed by load (see
	// picker.Config). 0: no cap.
	MaxMessages, MaxPromptBytes int
	// MaxConcurrentDecisions caps decisions parsing, tokenizing and
	// matching at once; a decision without a slot after 10 s is shed
	// with 429. 0: no cap.
	MaxConcurrentDecisions int
	// MaxStreams caps concurrent ext_proc streams per connection (0: 4096)
	// and StreamIdleTimeout closes silent streams (see
	// extproc.ServerConfig; 0: never).
	MaxStreams        uint32
	StreamIdleTimeout time.Duration
	// ConnIdleTimeout closes an ext_proc connection with no open stream
	// for this long, and one that has not finished its handshake after
	// min(this, 10 s) (extproc.ServerConfig; 0: never).
	ConnIdleTimeout time.Duration
	// ReplicaSync shares request lifecycles with peer replicas over NATS.
	ReplicaSync bool
	// RouterID names this replica for replica sync (default: $POD_NAME,
	// else the host name).
	RouterID string
	// DrainDelay is how long the router keeps serving after readiness
	// turns NOT_SERVING on shutdown, before it stops accepting streams.
	DrainDelay time.Duration
	// ShutdownGrace bounds the graceful stop of open streams (default 15 s).
	ShutdownGrace time.Duration
	// Recovery configures failure recovery: heartbeats, lease-flap grace,
	// resyncs and warm starts (config_recovery.go).
	Recovery RecoveryConfig
	// Registerer receives the Prometheus metrics; nil makes a private
	// registry (served on /metrics either way).
	Registry *prometheus.Registry
	// Logger may be nil (slog.Default()).
	Logger *slog.Logger
}

// Default caps on what one decision renders and tokenizes: well above
// real chats (agent sessions run to a few hundred messages; a 128k-token
// context renders to ~0.5 MB), far below what exhausts memory.
const (
	DefaultMaxMessages    = 4096
	DefaultMaxPromptBytes = 4 << 20
)

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Namespace:        "default",
		GRPCAddr:         ":9002",
		HTTPAddr:         ":9090",
		AdminAddr:        "127.0.0.1:9091",
		EmbeddedNATSAddr: "127.0.0.1:4222",
		Scoring:          scoring.DefaultOptions(),
		KVEvents:         true,
		Fallbacks:        2,
		RequestLogSize:   DefaultRequestLogSize,
		ShutdownGrace:    15 * time.Second,
		Recovery:         DefaultRecoveryConfig(),
		MaxMessages:      DefaultMaxMessages,
		MaxPromptBytes:   DefaultMaxPromptBytes,
		// Decisions are CPU-bound: more at once than cores only adds memory
		// (each holds its parsed body, ~9× the body's bytes).
		MaxConcurrentDecisions: max(4, 2*runtime.GOMAXPROCS(0)),
		MaxStreams:             4096,
		StreamIdleTimeout:      5 * time.Minute,
		ConnIdleTimeout:        extproc.DefaultConnIdleTimeout,
		// Envoy before 1.33 sends no protocol_config; BUFFERED is what such
		// deployments configure.
		Stream: extproc.Config{DefaultRequestMode: extproc.ModeBuffered},
	}
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace is empty"))
	} else if !discovery.ValidName(c.Namespace) {
		// A namespace is a NATS subject token: '*' or '>' would subscribe
		// to every namespace's events.
		errs = append(errs, fmt.Errorf("namespace %q: want 1-%d characters of [A-Za-z0-9_-] (no wildcards)", c.Namespace, discovery.MaxIDLen))
	}
	if c.GRPCAddr == "" {
		errs = append(errs, errors.New("grpc address is empty"))
	}
	if _, err := c.workerSource(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateEngineFeed()...)
	if c.Fallbacks < 0 {
		errs = append(errs, fmt.Errorf("fallbacks %d must not be negative", c.Fallbacks))
	}
	if c.RequestLogSize < 0 {
		errs = append(errs, fmt.Errorf("request log size %d must not be negative (0 turns the log off)", c.RequestLogSize))
	}
	if c.MaxMessages < 0 || c.MaxPromptBytes < 0 || c.MaxConcurrentDecisions < 0 || c.StreamIdleTimeout < 0 || c.ConnIdleTimeout < 0 {
		errs = append(errs, errors.New("max messages, max prompt bytes, max concurrent decisions and the stream and connection idle timeouts must not be negative (0 turns each off)"))
	}
	if c.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("block size %d must not be negative", c.BlockSize))
	}
	if err := c.Scoring.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Recovery.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Recovery.DurableEvents && (!c.KVEvents || c.EngineEvents == EngineEventsZMQ) {
		errs = append(errs, errors.New("--durable-events needs KV events over NATS (not --kv-events=false or --engine-events zmq): the JetStream stream it recovers from captures the NATS event subjects, and with --engine-events zmq no event passes through NATS; use --warm-from to start from a peer's index, and the engines' replay sockets fill short gaps"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("router config: %w", errors.Join(errs...))
	}
	return nil
}
