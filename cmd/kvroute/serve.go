package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/costflag"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
)

// serveFlags are `kvroute serve`'s settings beyond server.Config.
type serveFlags struct {
	cfg                       server.Config
	tokenizers                stringList
	chatTemplates             stringList
	etcdEndpoints             string
	etcdCert, etcdKey, etcdCA string
	noKVEvents                bool
	etcdPasswordFile          string
	targetValue               string
	onBadBody                 string
	defaultBodyMode           string
	tlsCert, tlsKey, tlsCA    string
	log                       *cli.LogFlags
	cost                      *costflag.Flags
}

func newServeFlags() (*cli.Command, *serveFlags) {
	s := &serveFlags{cfg: server.DefaultConfig()}
	c, o := &s.cfg, &s.cfg.Scoring
	cmd := cli.NewCommand("kvroute", serveUsage)
	cmd.Env = envName
	fs := cmd.Flags

	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "fleet namespace: etcd keys /kvroute/<ns>/workers/ and NATS subjects kvroute.<ns>.*")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", c.GRPCAddr, "ext_proc gRPC (and gRPC health) listen `address`")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "HTTP `address` for /metrics, /healthz, /readyz, /debug/workers, /debug/explain, /admin/mode (\"-\" disables). POST /admin/mode {\"mode\":\"...\"} switches the router mode at runtime: requests in flight and queued move to the new mode; worker load reports refill within ~250 ms")
	fs.StringVar(&c.NATSURL, "nats-url", "", "NATS `url` for KV events, load reports and replica sync; empty starts an embedded NATS server")
	fs.StringVar(&c.NATSCredsFile, "nats-creds", "", "NATS credentials `file` (JWT and NKey seed, as nsc writes it) for --nats-url")
	fs.StringVar(&c.EmbeddedNATSAddr, "embedded-nats-addr", c.EmbeddedNATSAddr, "listen `address` of the embedded NATS server (workers publish here)")
	fs.StringVar(&s.etcdEndpoints, "etcd-endpoints", "", "comma-separated etcd `urls` to discover workers from (leased records)")
	fs.StringVar(&c.EtcdUsername, "etcd-username", "", "etcd user")
	fs.StringVar(&c.EtcdPassword, "etcd-password", "", "etcd password (prefer --etcd-password-file: a command line is visible to every user of the host)")
	fs.StringVar(&s.etcdPasswordFile, "etcd-password-file", "", "`file` holding the etcd password (trailing newline ignored), e.g. a mounted Kubernetes Secret")
	fs.StringVar(&s.etcdCert, "etcd-cert", "", "client certificate `file` for etcd TLS")
	fs.StringVar(&s.etcdKey, "etcd-key", "", "client key `file` for etcd TLS")
	fs.StringVar(&s.etcdCA, "etcd-ca", "", "CA `file` that signs the etcd server certificate (enables TLS)")
	fs.StringVar(&c.WorkersFile, "workers-file", "", "static YAML or JSON `file` of worker records, reloaded on change (instead of etcd)")
	fs.DurationVar(&c.WorkersFileInterval, "workers-file-interval", 2*time.Second, "how often --workers-file is checked for changes")
	fs.StringVar(&c.PoolName, "pool-name", "", "discover workers from this Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1): its selector's Ready pods, one worker per target port (instead of etcd or a file)")
	fs.StringVar(&c.PoolNamespace, "pool-namespace", "default", "namespace of --pool-name")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig `file` for --pool-name outside a cluster (empty: in-cluster service account)")
	fs.StringVar(&c.PoolDefaults.Model, "pool-model", "", "served model of --pool-name's pods without a kvroute.io/model annotation")
	fs.IntVar(&c.PoolDefaults.BlockSize, "pool-block-size", 16, "KV block size of --pool-name's pods without a kvroute.io/block-size annotation")
	fs.IntVar(&c.PoolDefaults.KVTotalBlocks, "pool-kv-blocks", 0, "KV capacity in blocks of --pool-name's pods without a kvroute.io/kv-total-blocks annotation (0: from each engine's /metrics with --engine-load scrape)")
	fs.StringVar(&c.EngineEvents, "engine-events", server.EngineEventsNATS, "where KV events come from: nats (published by kvbridge or kvsim) or zmq (subscribe to every worker's engine, vLLM --kv-events-config, directly)")
	fs.IntVar(&c.EngineEventsPort, "engine-events-port", 5557, "the engines' ZMQ KV event publisher port for --engine-events zmq (data-parallel rank r: port+r)")
	fs.IntVar(&c.EngineReplayPort, "engine-replay-port", 5558, "the engines' ZMQ replay port for --engine-events zmq (-1: none; every gap then clears the worker's view)")
	fs.StringVar(&c.EngineEventsTopic, "engine-events-topic", "", "ZMQ topic filter for --engine-events zmq (vLLM's kv-events-config topic; empty: all)")
	fs.StringVar(&c.EngineLoad, "engine-load", server.EngineLoadNATS, "where load reports come from: nats (published by kvbridge or kvsim) or scrape (read every worker's /metrics each 250 ms)")
	fs.StringVar(&c.Engine, "engine", "vllm", "metric names for --engine-load scrape: vllm or sglang")
	fs.Var(&s.tokenizers, "tokenizer", "`MODEL=DIR`: tokenizer.json and tokenizer_config.json for MODEL (repeatable; LoRA adapters use their base model's); models without one are routed by load")
	fs.Var(&s.chatTemplates, "chat-template", "`MODEL=FILE`: chat template that replaces MODEL's own, as the model server's --chat-template (repeatable; MODEL needs a --tokenizer)")

	fs.StringVar(&o.Mode, "router-mode", o.Mode, "router mode: "+strings.Join(scoring.ModeNames(), ", "))
	s.cost = costflag.Register(fs, o)
	fs.BoolVar(&c.KVEvents, "kv-events", true, "consume vLLM KV events from NATS for the kv mode; --kv-events=false: kv mode predicts caches from its own decisions (kv_without_events)")
	fs.BoolVar(&s.noKVEvents, "no-kv-events", false, cli.Hidden+"deprecated: --kv-events=false")
	fs.IntVar(&c.BlockSize, "kv-cache-block-size", 0, "override every worker's KV block size in tokens (0: use each record's block_size)")
	fs.DurationVar(&o.MaxRequestAge, "max-request-age", o.MaxRequestAge, "force-free requests with no lifecycle news for this long")
	fs.DurationVar(&o.StaleReportAge, "stale-report-age", o.StaleReportAge, "ignore worker load reports older than this")

	fs.StringVar(&c.XDSAddr, "xds-addr", "", "serve the discovered workers to Envoy over ADS at this `address`, one cluster per worker (bootstrap: kvroute envoy-config --style xds); empty: off")
	fs.StringVar(&c.XDSNodeID, "xds-node-id", "", "answer ADS only for the Envoy with this node id (envoy-config's --node-id, default kvroute-envoy); empty: every Envoy")
	fs.StringVar(&c.Stream.TargetHeader, "target-header", extproc.DefaultTargetHeader, "request header that names the chosen worker")
	fs.StringVar(&s.targetValue, "target-value", "cluster", "what --target-header holds: cluster (the record's Envoy cluster) or address (ip:port)")
	fs.IntVar(&c.Fallbacks, "fallbacks", c.Fallbacks, "next-best endpoints appended to x-gateway-destination-endpoint and its envoy.lb metadata (Gateway API endpoint picker protocol). Set 0 with plain Envoy's ORIGINAL_DST cluster (envoy/original-dst.yaml): it reads the header as one ip:port and answers a list with 503")
	fs.IntVar(&c.Stream.MaxBodyBytes, "max-body-bytes", 16<<20, "largest request body accepted; larger ones get 413")
	fs.StringVar(&s.onBadBody, "on-bad-body", "reject", "body that is not JSON: reject (400) or route-by-load")
	fs.BoolVar(&c.Stream.DebugHeaders, "debug-headers", false, "add x-kvroute-cached-tokens and x-kvroute-mode to upstream requests")
	fs.StringVar(&s.defaultBodyMode, "default-body-mode", "BUFFERED", "request body mode assumed when Envoy sends no protocol_config (Envoy < 1.33): NONE, BUFFERED or FULL_DUPLEX_STREAMED")
	fs.StringVar(&c.ModelHeader, "model-header", "", "request header carrying the model when Envoy sends no body (body mode NONE)")
	fs.StringVar(&s.tlsCert, "tls-cert", "", "server certificate `file`: serve ext_proc over TLS")
	fs.StringVar(&s.tlsKey, "tls-key", "", "server key `file`")
	fs.StringVar(&s.tlsCA, "tls-client-ca", "", "CA `file` for client certificates: require mTLS")
	fs.DurationVar(&c.KeepaliveMinTime, "keepalive-min-time", time.Second, "shortest HTTP/2 ping interval tolerated from Envoy (its connection_keepalive must not ping faster)")
	fs.BoolVar(&c.ReplicaSync, "replica-sync", false, "share in-flight request load with other kvroute replicas over NATS")
	fs.StringVar(&c.RouterID, "router-id", "", "this replica's id for replica sync (default hostname-pid)")
	fs.DurationVar(&c.DrainDelay, "shutdown-drain-delay", 2*time.Second, "on SIGTERM, keep routing this long with readiness off before refusing new streams")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", c.ShutdownGrace, "on SIGTERM, how long open streams may finish before they are cut")
	s.log = cli.RegisterLog(fs, "info")
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
	if s.etcdEndpoints != "" {
		c.EtcdEndpoints = strings.Split(s.etcdEndpoints, ",")
	}
	if s.noKVEvents {
		fmt.Fprintln(stderr, "kvroute: --no-kv-events is deprecated; use --kv-events=false")
		c.KVEvents = false
	}
	if s.etcdPasswordFile != "" {
		if c.EtcdPassword != "" {
			return c, cli.Usagef("give --etcd-password or --etcd-password-file, not both")
		}
		b, err := os.ReadFile(s.etcdPasswordFile)
		if err != nil {
			return c, fmt.Errorf("--etcd-password-file: %w", err)
		}
		c.EtcdPassword = strings.TrimRight(string(b), "\r\n")
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
	if s.etcdCA != "" || s.etcdCert != "" {
		if c.EtcdTLS, err = etcdTLS(s.etcdCert, s.etcdKey, s.etcdCA); err != nil {
			return c, err
		}
	}
	if c.Logger, err = s.log.Logger(stderr); err != nil {
		return c, err
	}
	if err := c.Validate(); err != nil {
		return c, &cli.UsageError{Err: err, Cmd: "kvroute"}
	}
	return c, nil
}

func etcdTLS(cert, key, ca string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("etcd CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA %s holds no PEM certificate", ca)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// parseServe parses args and the environment into a server.Config;
// --help and --version print on stdout, notes and logs go to out.
func parseServe(args []string, stdout, out io.Writer, lookupEnv func(string) (string, bool)) (server.Config, error) {
	cmd, s := newServeFlags()
	fs := cmd.Flags
	if err := cmd.Parse(args, nil, stdout, false); err != nil {
		return server.Config{}, err
	}
	if err := legacyEnv(fs, lookupEnv, out); err != nil {
		return server.Config{}, err
	}
	if err := applyEnv(fs, lookupEnv); err != nil {
		return server.Config{}, &cli.UsageError{Err: err, Cmd: "kvroute"}
	}
	return s.config(out)
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	cfg, err := parseServe(args, stdout, stderr, lookupEnv)
	if err != nil {
		return err
	}
	return server.Run(ctx, cfg)
}
