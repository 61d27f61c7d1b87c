package main

import (
	"io"
	"time"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/envflag"
	"github.com/kvroute/kvroute/internal/sim"
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
	mmFamily       string
	namespace      string
	natsURL        string
	etcdEndpoints  string
	leaseTTL       time.Duration
	numGPUBlocks   int
	blockSize      int
	maxNumSeqs     int
	maxBatched     int
	timing         string
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
	log            *cli.LogFlags
}

// envName is the environment variable that sets a flag: KVROUTE_<FLAG>,
// except --workers-file. kvsim writes that file and kvroute reads it, so
// one shared KVROUTE_WORKERS_FILE would make kvsim overwrite the file a
// router in the same environment was told to read: kvsim's is
// KVROUTE_KVSIM_WORKERS_FILE.
func envName(flagName string) string {
	if flagName == "workers-file" {
		return "KVROUTE_KVSIM_WORKERS_FILE"
	}
	return envflag.Name(flagName)
}

const summary = `kvsim runs simulated vLLM workers: an OpenAI-compatible server per worker,
a paged KV cache with prefix caching, continuous batching, step times from
--timing (NVIDIA Dynamo mocker's polynomial by default, or a GPU profile that
charges cached context), KV events and load reports on NATS, leased
registration in etcd. Each flag can also be set with the environment variable shown; a flag
on the command line wins.

Usage:
  kvsim [flags]
  kvsim version`

const footer = `Admin endpoint (--admin-addr):
  GET  /admin/workers                              workers and their stats
  POST /admin/workers/{id}/kill                    stop HTTP and the etcd keepalive, like a crash
  POST /admin/workers/{id}/reset                   drop the prefix cache (AllBlocksCleared)
  POST /admin/workers/{id}/resync                  re-announce the cache (AllBlocksCleared, then every block)
  POST /admin/workers/{id}/drop-events?n=1         drop the next n KV event batches on NATS
  POST /admin/workers/{id}/duplicate-events?n=1    publish the next n batches twice on NATS`

func newCommand(o *options) *cli.Command {
	c := cli.NewCommand("kvsim", summary)
	c.Footer, c.Env = footer, envName
	fs := c.Flags
	fs.IntVar(&o.workers, "workers", 1, "number of simulated workers in this process")
	fs.IntVar(&o.basePort, "base-port", 8100, "HTTP port of worker 0; worker i listens on base-port+i (0: free ports)")
	fs.StringVar(&o.host, "host", "127.0.0.1", "listen host for the workers' HTTP servers")
	fs.StringVar(&o.advertiseHost, "advertise-host", "", "host written into the etcd records (default: --host)")
	fs.StringVar(&o.idPrefix, "id-prefix", "w", "workers are named <id-prefix>0, <id-prefix>1, ...")
	fs.StringVar(&o.model, "model", sim.DefaultModel, "served model name (kvbench sends the same name by default)")
	fs.StringVar(&o.tokenizerDir, "tokenizer", "", "folder with tokenizer.json and tokenizer_config.json; without it text is encoded one token per byte")
	fs.StringVar(&o.chatTemplate, "chat-template", "", "chat template file overriding the tokenizer's (vLLM's --chat-template)")
	fs.StringVar(&o.mmFamily, "mm-family", "", "serve a vision-language model of this family (qwen2.5-vl, qwen2-vl, qwen3-vl, gemma3): chat images (data: URLs) are expanded to the processor's tokens and their blocks keyed by the image part's uuid or its SHA-256, in the KV events' extra_keys too; needs --tokenizer")
	fs.StringVar(&o.namespace, "namespace", "default", "fleet namespace in NATS subjects and etcd keys")
	fs.StringVar(&o.natsURL, "nats-url", "", "NATS server for KV events and load reports (empty: none)")
	fs.StringVar(&o.etcdEndpoints, "etcd-endpoints", "", "comma-separated etcd endpoints for leased registration (empty: none)")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 10*time.Second, "etcd lease TTL")
	fs.IntVar(&o.numGPUBlocks, "num-gpu-blocks", sim.DefaultNumGPUBlocks, "KV cache blocks per worker")
	fs.IntVar(&o.blockSize, "block-size", sim.DefaultBlockSize, "tokens per KV block (vLLM's default is 16)")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 256, "maximum running requests per worker")
	fs.IntVar(&o.maxBatched, "max-num-batched-tokens", 8192, "maximum tokens scheduled per step")
	fs.StringVar(&o.timing, "timing", sim.TimingPolynomial, sim.TimingUsage)
	fs.Float64Var(&o.speedup, "speedup", 1, "divide every simulated step time by this")
	fs.Float64Var(&o.jitter, "jitter", 0, "relative random spread of step times, e.g. 0.1 for ±10%")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the jitter source (worker i uses seed+i)")
	fs.IntVar(&o.defaultMaxToks, "default-max-tokens", 256, "output length of chat requests without max_tokens (completions default to 16)")
	fs.Float64Var(&o.eosProbability, "eos-probability", 0, "chance that a generated token is EOS for requests without ignore_eos (0: never, outputs always reach max_tokens)")
	fs.IntVar(&o.eventBatchMax, "event-batch-max", 256, "KV events per published batch at most")
	fs.DurationVar(&o.eventFlush, "event-flush-interval", 0, "gather KV events for up to this long after the first before publishing them as one batch (0: one batch per engine step, as vLLM publishes)")
	fs.DurationVar(&o.loadInterval, "load-interval", 200*time.Millisecond, "load report period")
	fs.IntVar(&o.zmqBasePort, "zmq-base-port", 0, "also publish KV events as vLLM does over ZMQ: worker i binds PUB on port zmq-base-port+2i and replay ROUTER on the next (0: off)")
	fs.StringVar(&o.zmqTopic, "zmq-topic", "", "topic frame of the ZMQ KV event messages (vLLM's default is empty)")
	fs.StringVar(&o.adminAddr, "admin-addr", "", "address of the fault-switch admin endpoint, e.g. 127.0.0.1:8099 (empty: off)")
	fs.StringVar(&o.workersFile, "workers-file", "", "write the workers' records to this `file` (JSON, which YAML readers accept), for `kvroute --workers-file` without etcd (empty: none)")
	o.log = cli.RegisterLog(fs, "info")
	return c
}

// parseFlags reads the command line, then KVROUTE_* variables for the flags
// it did not set; --help and --version print on out.
func parseFlags(args []string, getenv func(string) string, out io.Writer) (*options, error) {
	o := &options{}
	if err := newCommand(o).Parse(args, envflag.Getenv(getenv), out, false); err != nil {
		return nil, err
	}
	return o, nil
}
