package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"time"

	"github.com/kvroute/kvroute/bridge"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/connflag"
	"github.com/kvroute/kvroute/internal/envflag"
)

// options are kvbridge's command-line settings.
type options struct {
	engine           string
	engineURL        string
	eventsEndpoint   string
	eventsListen     string
	replayEndpoint   string
	topic            string
	dpSize           int
	workerID         string
	namespace        string
	natsURL          string
	etcdEndpoints    string
	advertiseAddress string
	cluster          string
	blockSize        int
	kvTotalBlocks    int
	maxNumSeqs       int
	maxBatched       int
	weight           float64
	scrapeInterval   time.Duration
	unhealthyAfter   time.Duration
	leaseTTL         time.Duration
	replayTimeout    time.Duration
	settleDelay      time.Duration
	httpAddr         string
	log              *cli.LogFlags
	nats             *connflag.NATS
	etcd             *connflag.Etcd
}

// envName is the environment variable that sets a flag: KVROUTE_<FLAG>.
func envName(flagName string) string { return envflag.Name(flagName) }

// newFlagSet returns kvbridge's flags, bound to o.
const summary = `kvbridge is the sidecar that brings a stock vLLM or SGLang engine into a kvroute
fleet. It subscribes to the engine's ZMQ KV events and republishes each batch
unchanged on NATS (kvroute.<namespace>.events.<worker>, header Kvroute-Seq),
asking the engine's replay socket for batches it missed and publishing a
synthetic AllBlocksCleared when they cannot be had or the engine restarted;
it scrapes /metrics every --scrape-interval into load reports
(kvroute.<namespace>.load.<worker>); and, once /health and /v1/models answer,
registers the worker in etcd under a lease, deregistering on SIGTERM or when the
engine stops answering.

Start vLLM with prefix caching and ZMQ KV events, e.g.
  vllm serve MODEL --enable-prefix-caching --kv-events-config \
    '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
      "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'

Each flag can also be set with the environment variable shown; a flag on
the command line wins.

Usage:
  kvbridge [flags]
  kvbridge version`

func newFlagSet(o *options) *flag.FlagSet { return newCommand(o).Flags }

func newCommand(o *options) *cli.Command {
	c := cli.NewCommand("kvbridge", summary)
	c.Env = envName
	fs := c.Flags
	fs.StringVar(&o.engine, "engine", "vllm", "engine beside the bridge: vllm or sglang (picks the metric names)")
	fs.StringVar(&o.engineURL, "engine-url", "http://127.0.0.1:8000", "the engine's HTTP server (/health, /v1/models, /metrics)")
	fs.StringVar(&o.eventsEndpoint, "events-endpoint", "tcp://127.0.0.1:5557", "the engine's ZMQ KV event PUB endpoint (kv-events-config endpoint); rank r uses port+r")
	fs.StringVar(&o.eventsListen, "engine-events-listen", "", "bind a ZMQ SUB `endpoint` (e.g. tcp://0.0.0.0:5557) that the engine's PUB connects to, instead of dialling --events-endpoint (vLLM kv-events-config endpoint tcp://<this pod>:5557, as llm-d deploys it); rank r listens on port+r")
	fs.StringVar(&o.replayEndpoint, "replay-endpoint", "tcp://127.0.0.1:5558", "the engine's ZMQ replay endpoint (kv-events-config replay_endpoint); empty: none, every gap clears the worker")
	fs.StringVar(&o.topic, "topic", "", "ZMQ topic filter (kv-events-config topic); empty receives every topic")
	fs.IntVar(&o.dpSize, "data-parallel-size", 1, "data-parallel ranks of the engine; each rank is registered as worker <worker-id>-dp<rank>")
	fs.StringVar(&o.workerID, "worker-id", "", "worker id in etcd and NATS subjects (default: $POD_NAME, else the host name)")
	fs.StringVar(&o.namespace, "namespace", "default", "fleet namespace in NATS subjects and etcd keys")
	fs.StringVar(&o.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server for KV events and load reports")
	fs.StringVar(&o.etcdEndpoints, "etcd-endpoints", "", "comma-separated etcd endpoints for leased registration (empty: do not register)")
	o.nats, o.etcd = connflag.RegisterNATS(fs), connflag.RegisterEtcd(fs)
	fs.StringVar(&o.advertiseAddress, "advertise-address", "", "ip:port the router sends requests to (default: $POD_IP and the engine URL's port)")
	fs.StringVar(&o.cluster, "cluster", "", "Envoy cluster name written into x-target-worker (default: the worker id)")
	fs.IntVar(&o.blockSize, "block-size", 0, "KV block size in tokens (default: vllm:cache_config_info, SGLang's page_size)")
	fs.IntVar(&o.kvTotalBlocks, "kv-total-blocks", 0, "KV capacity in blocks per rank (default: from /metrics)")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 0, "engine's --max-num-seqs, copied into the registration (0: omit)")
	fs.IntVar(&o.maxBatched, "max-num-batched-tokens", 0, "engine's --max-num-batched-tokens, copied into the registration (0: omit)")
	fs.Float64Var(&o.weight, "weight", 0, "relative capacity for the weighted router mode (0: 1)")
	fs.DurationVar(&o.scrapeInterval, "scrape-interval", bridge.DefaultScrapeInterval, "how often /metrics is scraped and a load report published")
	fs.DurationVar(&o.unhealthyAfter, "unhealthy-after", bridge.DefaultUnhealthyAfter, "deregister after /metrics has failed this long; register again when the engine is ready")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 10*time.Second, "etcd lease TTL")
	fs.DurationVar(&o.replayTimeout, "replay-timeout", 2*time.Second, "longest wait for one replay answer from the engine")
	fs.DurationVar(&o.settleDelay, "settle-delay", bridge.DefaultSettleDelay, "after the first registration, wait this long before forwarding KV events so routers know the worker (negative: none)")
	fs.StringVar(&o.httpAddr, "http-addr", ":9091", "serves /healthz, /readyz and /metrics (kvbridge_*) for probes and scraping; empty: off")
	o.log = cli.RegisterLog(fs, "info")
	return c
}

// parseFlags applies KVROUTE_* variables, then the command line, then fills
// the defaults that come from the pod's environment.
func parseFlags(args []string, getenv func(string) string, hostname func() (string, error), out io.Writer) (*options, error) {
	o := &options{}
	if err := newCommand(o).Parse(args, envflag.Getenv(getenv), out, false); err != nil {
		return nil, err
	}
	if _, err := engine.ParseEngine(o.engine); err != nil {
		return nil, cli.Usagef("--engine: %w", err)
	}
	if o.workerID == "" {
		o.workerID = getenv("POD_NAME")
	}
	if o.workerID == "" {
		if h, err := hostname(); err == nil {
			o.workerID = h
		}
	}
	if o.workerID == "" {
		return nil, errors.New("--worker-id is empty and neither POD_NAME nor the host name is set")
	}
	if o.advertiseAddress == "" && o.etcdEndpoints != "" {
		ip := getenv("POD_IP")
		if ip == "" {
			return nil, errors.New("--advertise-address is empty and POD_IP is not set; the router needs the engine's ip:port")
		}
		u, err := url.Parse(o.engineURL)
		if err != nil || u.Port() == "" {
			return nil, fmt.Errorf("--engine-url %q has no port to advertise; set --advertise-address", o.engineURL)
		}
		o.advertiseAddress = net.JoinHostPort(ip, u.Port())
	}
	return o, nil
}
