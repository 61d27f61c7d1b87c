package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/connflag"
	"github.com/kvroute/kvroute/internal/costflag"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/prometheus/client_golang/prometheus"
)

// serveFlags are `kvroute serve`'s settings beyond server.Config.
type serveFlags struct {
	cfg                    server.Config
	tokenizers             stringList
	chatTemplates          stringList
	mmModels               stringList
	mmInjectUUID           bool
	etcdEndpoints          string
	noKVEvents             bool
	maxStreams             uint
	targetValue            string
	onBadBody              string
	defaultBodyMode        string
	tlsCert, tlsKey, tlsCA string
	adminTokenFile         string
	allowRanges            string
	nats                   *connflag.NATS
	etcd                   *connflag.Etcd
	log                    *cli.LogFlags
	cost                   *costflag.Flags
	configFile             string
	// given names the flags set on the command line, in the environment or
	// in the configuration file.
	given map[string]bool
}

func newServeFlags() (*cli.Command, *serveFlags) {
	s := &serveFlags{cfg: server.DefaultConfig()}
	c, o := &s.cfg, &s.cfg.Scoring
	cmd := cli.NewCommand("kvroute", serveUsage)
	cmd.Env = envName
	fs := cmd.Flags

	fs.StringVar(&s.configFile, configFlag, "", "YAML configuration `file`: every setting has a key there (kvroute config print shows them all); the command line and KVROUTE_* variables win over it; the routing section reloads on change and on SIGHUP")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "fleet namespace: etcd keys /kvroute/<ns>/workers/ and NATS subjects kvroute.<ns>.*")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", c.GRPCAddr, "ext_proc gRPC (and gRPC health) listen `address`")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "HTTP `address` for /metrics, /healthz and /readyz (\"-\" disables)")
	fs.StringVar(&c.AdminAddr, "admin-listen", c.AdminAddr, "`address` of the admin listener: /debug/workers, /debug/explain, /debug/requests, /admin/mode (\"-\" disables). Loopback by default; POST /admin/mode {\"mode\":\"...\"} switches the router mode at runtime: requests in flight and queued move to the new mode; worker load reports refill within ~250 ms")
	fs.StringVar(&s.adminTokenFile, "admin-token-file", "", "`file` holding a bearer token the admin listener requires (Authorization: Bearer <token>); empty: none")
	fs.StringVar(&s.allowRanges, "allow-address-ranges", "", "comma-separated `CIDRs` (or IPs) of worker addresses to accept although link-local or metadata (169.254.0.0/16, fe80::/10, ... are refused by default)")
	fs.IntVar(&c.MaxMessages, "max-messages", c.MaxMessages, "chat requests with more messages are routed by load, not tokenized (0: no cap)")
	fs.BoolVar(&c.IndexGrowTables, "index-grow-tables", false, "KV index: grow each worker's table of engine hashes as its cache fills, instead of sizing it once for the worker's kv_total_blocks or the capacity its engine reports (about 26-40 bytes per block of capacity from the start, where a full cache would need that anyway)")
	fs.BoolVar(&c.IndexJumpSearch, "index-jump-search", false, "KV index: no effect, kept for configurations that set it (the index reads long prompts in chains of blocks; docs/index-peers.md)")
	fs.IntVar(&c.MaxPromptBytes, "max-prompt-bytes", c.MaxPromptBytes, "prompts whose rendered text is longer are routed by load, not tokenized (0: no cap)")
	fs.IntVar(&c.MaxConcurrentDecisions, "max-concurrent-decisions", c.MaxConcurrentDecisions, "routing decisions parsing and tokenizing at once; one that waits 10 s for a slot is shed with 429 (0: no cap; default 2×GOMAXPROCS, at least 4)")
	fs.UintVar(&s.maxStreams, "max-streams", uint(c.MaxStreams), "concurrent ext_proc streams per HTTP/2 connection (Envoy uses one stream per request)")
	fs.DurationVar(&c.StreamIdleTimeout, "stream-idle-timeout", c.StreamIdleTimeout, "close an ext_proc stream on which Envoy sent nothing for this long (a new stream must send within min(this, 10s)); keep it above the slowest time to first token; not applied after the response headers when Envoy sends no response body; 0: never")
	fs.DurationVar(&c.ConnIdleTimeout, "conn-idle-timeout", c.ConnIdleTimeout, "close an ext_proc connection with no open stream for this long (Envoy reconnects on its next request); one that has not finished its HTTP/2 or TLS handshake goes after min(this, 10s); 0: never")
	fs.StringVar(&c.NATSURL, "nats-url", "", "NATS `url` for KV events, load reports and replica sync; empty starts an embedded NATS server")
	fs.StringVar(&c.EmbeddedNATSAddr, "embedded-nats-addr", c.EmbeddedNATSAddr, "listen `address` of the embedded NATS server (workers publish here)")
	s.nats, s.etcd = connflag.RegisterNATS(fs), connflag.RegisterEtcd(fs)
	fs.StringVar(&s.etcdEndpoints, "etcd-endpoints", "", "comma-separated etcd `urls` to discover workers from (leased records)")
	fs.StringVar(&c.WorkersFile, "workers-file", "", "static YAML or JSON `file` of worker records, reloaded on change (instead of etcd)")
	fs.DurationVar(&c.WorkersFileInterval, "workers-file-interval", 2*time.Second, "how often --workers-file is checked for changes")
	fs.StringVar(&c.PoolName, "pool-name", "", "discover workers from this Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1): its selector's Ready pods, one worker per target port (instead of etcd or a file)")
	fs.StringVar(&c.PoolNamespace, "pool-namespace", "default", "namespace of --pool-name")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig `file` for --pool-name outside a cluster (empty: in-cluster service account)")
	fs.StringVar(&c.PoolDefaults.Model, "pool-model", "", "served model of --pool-name's pods without a kvroute.io/model annotation")
	fs.IntVar(&c.PoolDefaults.BlockSize, "pool-block-size", 16, "KV block size of --pool-name's pods without a kvroute.io/block-size annotation, until the engine states its own (vllm:cache_config_info, or its KV events), which wins")
	fs.IntVar(&c.PoolDefaults.KVTotalBlocks, "pool-kv-blocks", 0, "KV capacity in blocks of --pool-name's pods without a kvroute.io/kv-total-blocks annotation (0: from each engine's /metrics with --engine-load scrape)")
	fs.StringVar(&c.EngineEvents, "engine-events", server.EngineEventsNATS, "where KV events come from: nats (published by kvbridge or kvsim) or zmq (subscribe to every worker's engine, vLLM --kv-events-config, directly)")
	fs.IntVar(&c.EngineEventsPort, "engine-events-port", 5557, "the engines' ZMQ KV event publisher port for --engine-events zmq (data-parallel rank r: port+r)")
	fs.IntVar(&c.EngineReplayPort, "engine-replay-port", 5558, "the engines' ZMQ replay port for --engine-events zmq (-1: none; every gap then clears the worker's view)")
	fs.StringVar(&c.EngineEventsTopic, "engine-events-topic", "", "ZMQ topic filter for --engine-events zmq (vLLM's kv-events-config topic; empty: all)")
	fs.StringVar(&c.EngineEventsListen, "engine-events-listen", "", "bind one ZMQ SUB `endpoint` (e.g. tcp://0.0.0.0:5557) that every engine's PUB connects to, as llm-d deploys vLLM (kv-events-config endpoint tcp://<router>:5557, topic kv@<pod ip>[:<port>]@<model>), instead of dialling each engine; implies --engine-events zmq; replay only with --engine-replay-port given")
	fs.StringVar(&c.RenderAddr, "render-addr", "", "serve vLLM's render API (POST /v1/completions/render, /v1/chat/completions/render) from the router's tokenizers on this `address`, for engines that tokenize through a render service (llm-d-inference-sim --render-url); empty: off")
	fs.StringVar(&c.EngineLoad, "engine-load", server.EngineLoadNATS, "where load reports come from: nats (published by kvbridge or kvsim) or scrape (read every worker's /metrics each 250 ms)")
	fs.StringVar(&c.Engine, "engine", "vllm", "metric names for --engine-load scrape: vllm or sglang")
	fs.Var(&s.tokenizers, "tokenizer", "`MODEL=DIR`: tokenizer.json and tokenizer_config.json for MODEL (repeatable; LoRA adapters use their base model's); models without one are routed by load")
	fs.Var(&s.mmModels, "mm-model", "`MODEL=FAMILY`: MODEL is a vision-language model of FAMILY (qwen2.5-vl, qwen2-vl, qwen3-vl, gemma3): its image chats are expanded to the processor's tokens and hashed with each image's identity (repeatable; MODEL needs a --tokenizer and a chat template that loops over content)")
	fs.BoolVar(&s.mmInjectUUID, "mm-inject-uuid", true, "for --mm-model models, write each image's derived identity (SHA-256 of a data: URL's bytes, or of a remote URL) into the request body as the image part's \"uuid\" (vLLM ≥ 0.10.2), so that the engine keys its KV blocks as the router hashes them; needs body mode BUFFERED or FULL_DUPLEX_STREAMED")
	fs.Var(&s.chatTemplates, "chat-template", "`MODEL=FILE`: chat template that replaces MODEL's own, as the model server's --chat-template (repeatable; MODEL needs a --tokenizer)")

	fs.StringVar(&o.Mode, "router-mode", o.Mode, "router mode: "+strings.Join(scoring.ModeNames(), ", "))
	s.cost = costflag.Register(fs, o)
	fs.BoolVar(&c.KVEvents, "kv-events", true, "consume vLLM KV events from NATS for the kv mode; --kv-events=false: kv mode predicts caches from its own decisions (kv_without_events)")
	fs.BoolVar(&s.noKVEvents, "no-kv-events", false, cli.Hidden+"deprecated: --kv-events=false")
	fs.IntVar(&c.BlockSize, "kv-cache-block-size", 0, "override every worker's KV block size in tokens (0: use each record's block_size)")
	fs.DurationVar(&o.MaxRequestAge, "max-request-age", o.MaxRequestAge, "force-free requests with no lifecycle news for this long")
	fs.DurationVar(&o.StaleReportAge, "stale-report-age", o.StaleReportAge, "ignore worker load reports older than this")

	fs.StringVar(&c.XDSAddr, "xds-addr", "", "serve the discovered workers to Envoy over ADS at this `address`, as one cluster, kvroute_workers (bootstrap: kvroute envoy-config --style xds); empty: off")
	fs.StringVar(&c.XDSNodeID, "xds-node-id", "", "answer ADS only for the Envoy with this node id (envoy-config's --node-id, default kvroute-envoy); empty: every Envoy")
	fs.StringVar(&c.Stream.TargetHeader, "target-header", extproc.DefaultTargetHeader, "request header that names the chosen worker")
	fs.StringVar(&s.targetValue, "target-value", "cluster", "what --target-header holds: cluster (the record's Envoy cluster) or address (ip:port)")
	fs.IntVar(&c.Fallbacks, "fallbacks", c.Fallbacks, "next-best endpoints appended to x-gateway-destination-endpoint and its envoy.lb metadata (Gateway API endpoint picker protocol). Set 0 with plain Envoy's ORIGINAL_DST cluster (envoy/original-dst.yaml): it reads the header as one ip:port and answers a list with 503")
	fs.IntVar(&c.Stream.MaxBodyBytes, "max-body-bytes", 16<<20, "largest request body accepted; larger ones get 413")
	fs.StringVar(&s.onBadBody, "on-bad-body", "reject", "body that is not JSON: reject (400) or route-by-load")
	fs.BoolVar(&c.Stream.DebugHeaders, "debug-headers", false, "add x-kvroute-cached-tokens and x-kvroute-mode to upstream requests")
	fs.BoolVar(&c.Stream.ResponseWorkerHeader, "response-worker-header", false, "add x-kvroute-worker (the chosen worker's id) to responses; rides on the routing answer's envoy.lb metadata (or the response-headers message with --response-path headers): no round trip")
	fs.IntVar(&c.RequestLogSize, "request-log-size", server.DefaultRequestLogSize, "recent decisions kept for the admin listener's /debug/requests, each with its explanation and outcome (0: off)")
	fs.StringVar(&s.defaultBodyMode, "default-body-mode", "BUFFERED", "request body mode assumed when Envoy sends no protocol_config (Envoy < 1.33): NONE, BUFFERED or FULL_DUPLEX_STREAMED")
	fs.StringVar(&c.ModelHeader, "model-header", "", "request header carrying the model when Envoy sends no body (body mode NONE)")
	fs.StringVar(&s.tlsCert, "tls-cert", "", "server certificate `file`: serve ext_proc over TLS")
	fs.StringVar(&s.tlsKey, "tls-key", "", "server key `file`")
	fs.StringVar(&s.tlsCA, "tls-client-ca", "", "CA `file` for client certificates: require mTLS")
	fs.DurationVar(&c.KeepaliveMinTime, "keepalive-min-time", time.Second, "shortest HTTP/2 ping interval tolerated from Envoy (its connection_keepalive must not ping faster)")
	fs.BoolVar(&c.ReplicaSync, "replica-sync", false, "share in-flight request load with other kvroute replicas over NATS")
	fs.StringVar(&c.RouterID, "router-id", "", "this replica's id for replica sync (default $POD_NAME, else the host name; give each replica on one host its own)")
	fs.DurationVar(&c.DrainDelay, "shutdown-drain-delay", 2*time.Second, "on SIGTERM, keep routing this long with readiness off before refusing new streams")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", c.ShutdownGrace, "on SIGTERM, how long open streams may finish before they are cut")
	registerRecoveryFlags(fs, c)
	s.log = cli.RegisterLog(fs, "info")
	cmd.Groups = serveGroups
	cmd.Brief, cmd.BriefFooter = serveBrief, serveBriefFooter
	return cmd, s
}

// config turns parsed flags into a server.Config.
func (s *serveFlags) config(stderr io.Writer) (server.Config, error) {
	if err := s.cost.Finish(stderr); err != nil {
		return s.cfg, err
	}
	c := s.cfg
	var err error
	if c.Tokenizers, err = parseTokenizers(s.tokenizers, s.chatTemplates); err != nil {
		return c, err
	}
	if c.Multimodal, err = parseMMModels(s.mmModels, s.mmInjectUUID); err != nil {
		return c, err
	}
	if s.etcdEndpoints != "" {
		c.EtcdEndpoints = strings.Split(s.etcdEndpoints, ",")
	}
	if c.EngineEventsListen != "" {
		// Engines that connect to the router have no known replay socket
		// unless the operator names its port.
		if !s.given["engine-events"] {
			c.EngineEvents = server.EngineEventsZMQ
		}
		if !s.given["engine-replay-port"] {
			c.EngineReplayPort = -1
		}
	}
	if s.noKVEvents {
		fmt.Fprintln(stderr, "kvroute: --no-kv-events is deprecated; use --kv-events=false")
		c.KVEvents = false
	}
	c.EtcdUsername, c.NATSUser = s.etcd.Username, s.nats.User
	c.NATSCredsFile, c.NATSNKeySeedFile = s.nats.CredsFile, s.nats.NKeySeedFile
	if c.EtcdPassword, err = s.etcd.Secret(); err != nil {
		return c, cli.Usagef("%v", err)
	}
	if c.NATSPassword, err = s.nats.Secret(); err != nil {
		return c, cli.Usagef("%v", err)
	}
	if c.AdminToken, err = connflag.Secret("", "", s.adminTokenFile); err != nil {
		return c, err
	}
	if s.adminTokenFile != "" && c.AdminToken == "" {
		return c, fmt.Errorf("--admin-token-file %s is empty", s.adminTokenFile)
	}
	if c.AllowAddressRanges, err = discovery.ParseAllowRanges(s.allowRanges); err != nil {
		return c, cli.Usagef("--allow-address-ranges: %v", err)
	}
	c.MaxStreams = uint32(min(s.maxStreams, 1<<31))
	if c.NATSTLS, err = s.nats.TLS(); err != nil {
		return c, err
	}
	switch s.targetValue {
	case "cluster":
		c.Stream.TargetValue = extproc.TargetCluster
	case "address":
		c.Stream.TargetValue = extproc.TargetAddress
	default:
		return c, cli.Usagef("--target-value %q: want cluster or address", s.targetValue)
	}
	if c.OnBadBody, err = picker.ParseBadBodyPolicy(s.onBadBody); err != nil {
		return c, err
	}
	switch strings.ToUpper(s.defaultBodyMode) {
	case "NONE":
		c.Stream.DefaultRequestMode = extproc.ModeNone
	case "BUFFERED":
		c.Stream.DefaultRequestMode = extproc.ModeBuffered
	case "FULL_DUPLEX_STREAMED":
		c.Stream.DefaultRequestMode = extproc.ModeFullDuplex
	default:
		return c, cli.Usagef("--default-body-mode %q: want NONE, BUFFERED or FULL_DUPLEX_STREAMED", s.defaultBodyMode)
	}
	if s.tlsCert != "" || s.tlsKey != "" {
		if c.TLS, err = extproc.LoadTLS(s.tlsCert, s.tlsKey, s.tlsCA); err != nil {
			return c, err
		}
	} else if s.tlsCA != "" {
		return c, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if c.EtcdTLS, err = s.etcd.TLS(); err != nil {
		return c, err
	}
	if c.Logger, err = s.log.Logger(stderr); err != nil {
		return c, err
	}
	c.Recovery.StateDir = stateDir(c.Recovery.StateDir)
	if err := c.Validate(); err != nil {
		return c, &cli.UsageError{Err: err, Cmd: "kvroute"}
	}
	return c, nil
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	st, err := loadServe(args, stdout, stderr, lookupEnv, os.ReadFile)
	if err != nil {
		return err
	}
	cfg, err := st.config(stderr)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	var rl *reloader
	if st.file != "" {
		// Watch SIGHUP before the router starts, so that one sent early
		// does not end the process.
		if rl, err = newReloader(st, args, lookupEnv, nil, cfg.Logger, reg); err != nil {
			return err
		}
		defer rl.watchHUP()()
	}
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		return err
	}
	if rl != nil {
		rl.router = srv
		done := make(chan struct{})
		rctx, cancel := context.WithCancel(ctx)
		go func() { defer close(done); rl.run(rctx) }()
		defer func() { cancel(); <-done }()
	}
	return srv.Wait()
}
