package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/kvroute/kvroute/internal/envflag"
)

// options are kvsim's command-line settings.
type options struct {
	workers        int
	basePort       int
	host           string
	advertiseHost  string
	idPrefix       string
	model          string
	tokenizerDir   string
	chatTemplate   string
	namespace      string
	natsURL        string
	etcdEndpoints  string
	leaseTTL       time.Duration
	numGPUBlocks   int
	blockSize      int
	maxNumSeqs     int
	maxBatched     int
	speedup        float64
	jitter         float64
	seed           uint64
	defaultMaxToks int
	eosProbability float64
	eventBatchMax  int
	eventFlush     time.Duration
	loadInterval   time.Duration
	zmqBasePort    int
	zmqTopic       string
	adminAddr      string
	workersFile    string
	logLevel       string
}

// envName is the environment variable that sets a flag: KVROUTE_<FLAG>.
func envName(flagName string) string { return envflag.Name(flagName) }

func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("kvsim", flag.ContinueOnError)
	fs.IntVar(&o.workers, "workers", 1, "number of simulated workers in this process")
	fs.IntVar(&o.basePort, "base-port", 8100, "HTTP port of worker 0; worker i listens on base-port+i (0: free ports)")
	fs.StringVar(&o.host, "host", "127.0.0.1", "listen host for the workers' HTTP servers")
	fs.StringVar(&o.advertiseHost, "advertise-host", "", "host written into the etcd records (default: --host)")
	fs.StringVar(&o.idPrefix, "id-prefix", "w", "workers are named <id-prefix>0, <id-prefix>1, ...")
	fs.StringVar(&o.model, "model", "kvsim", "served model name")
	fs.StringVar(&o.tokenizerDir, "tokenizer", "", "folder with tokenizer.json and tokenizer_config.json; without it text is encoded one token per byte")
	fs.StringVar(&o.chatTemplate, "chat-template", "", "chat template file overriding the tokenizer's (vLLM's --chat-template)")
	fs.StringVar(&o.namespace, "namespace", "default", "fleet namespace in NATS subjects and etcd keys")
	fs.StringVar(&o.natsURL, "nats-url", "", "NATS server for KV events and load reports (empty: none)")
	fs.StringVar(&o.etcdEndpoints, "etcd-endpoints", "", "comma-separated etcd endpoints for leased registration (empty: none)")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 10*time.Second, "etcd lease TTL")
	fs.IntVar(&o.numGPUBlocks, "num-gpu-blocks", 16384, "KV cache blocks per worker")
	fs.IntVar(&o.blockSize, "block-size", 64, "tokens per KV block (vLLM's default is 16)")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 256, "maximum running requests per worker")
	fs.IntVar(&o.maxBatched, "max-num-batched-tokens", 8192, "maximum tokens scheduled per step")
	fs.Float64Var(&o.speedup, "speedup", 1, "divide every simulated step time by this")
	fs.Float64Var(&o.jitter, "jitter", 0, "relative random spread of step times, e.g. 0.1 for ±10%")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the jitter source (worker i uses seed+i)")
	fs.IntVar(&o.defaultMaxToks, "default-max-tokens", 256, "output length of chat requests without max_tokens (completions default to 16)")
	fs.Float64Var(&o.eosProbability, "eos-probability", 0, "chance that a generated token is EOS for requests without ignore_eos (0: never, outputs always reach max_tokens)")
	fs.IntVar(&o.eventBatchMax, "event-batch-max", 256, "KV events per published batch at most")
	fs.DurationVar(&o.eventFlush, "event-flush-interval", 10*time.Millisecond, "a KV event batch is published at most this long after its first event")
	fs.DurationVar(&o.loadInterval, "load-interval", 200*time.Millisecond, "load report period")
	fs.IntVar(&o.zmqBasePort, "zmq-base-port", 0, "also publish KV events as vLLM does over ZMQ: worker i binds PUB on port zmq-base-port+2i and replay ROUTER on the next (0: off)")
	fs.StringVar(&o.zmqTopic, "zmq-topic", "", "topic frame of the ZMQ KV event messages (vLLM's default is empty)")
	fs.StringVar(&o.adminAddr, "admin-addr", "", "address of the fault-switch admin endpoint, e.g. 127.0.0.1:8099 (empty: off)")
	fs.StringVar(&o.workersFile, "workers-file", "", "write the workers' records to this static workers file for a router without etcd (empty: none)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprint(out, `kvsim runs simulated vLLM workers: an OpenAI-compatible server per worker,
a paged KV cache with prefix caching, continuous batching, the timing model of
NVIDIA Dynamo's mocker, KV events and load reports on NATS, leased registration
in etcd. Each flag can also be set with the environment variable KVROUTE_<FLAG>
(e.g. KVROUTE_NATS_URL); a flag on the command line wins.

Usage: kvsim [flags]

Flags:
`)
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" {
				def = " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(out, "  --%s\n      %s%s [%s]\n", f.Name, f.Usage, def, envName(f.Name))
		})
		fmt.Fprint(out, `
Admin endpoint (--admin-addr):
  GET  /admin/workers                              workers and their stats
  POST /admin/workers/{id}/kill                    stop HTTP and the etcd keepalive, like a crash
  POST /admin/workers/{id}/reset                   drop the prefix cache (AllBlocksCleared)
  POST /admin/workers/{id}/resync                  re-announce the cache (AllBlocksCleared, then every block)
  POST /admin/workers/{id}/drop-events?n=1         drop the next n KV event batches on NATS
  POST /admin/workers/{id}/duplicate-events?n=1    publish the next n batches twice on NATS
`)
	}
	return fs
}

// parseFlags applies KVROUTE_* variables, then the command line.
func parseFlags(args []string, getenv func(string) string, out io.Writer) (*options, error) {
	o := &options{}
	fs := newFlagSet(o)
	fs.SetOutput(out)
	if err := envflag.Parse(fs, args, envflag.Getenv(getenv)); err != nil {
		return nil, err
	}
	return o, nil
}
