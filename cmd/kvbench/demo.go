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
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/scoring"
)

// Demo defaults. The simulated GPU is Qwen3-8B in bf16 on one 80 GB H100:
// 36 layers × 8 KV heads × 128 dims × 2 (K and V) × 2 bytes = 144 KiB of KV
// per token; after 16 GB of weights and vLLM's 0.9 memory utilization about
// 52 GB are left for KV, ≈ 360k tokens = 5,632 blocks of 64 tokens. 64-token
// blocks are the Dynamo mocker's default (vLLM's CUDA default is 16; larger
// blocks only coarsen matching, and keep the event volume of 13k-token
// prompts manageable on two cores).
const (
	demoBlockSize   = 64
	demoKVBlocks    = 5632
	demoMaxRequests = 500
	demoSpeedup     = 5
)

// demoFlags are kvbench demo's settings.
type demoFlags struct {
	wl        workloadFlags
	workers   int
	modes     string
	jsonOut   string
	outDir    string
	blockSize int
	kvBlocks  int
	maxSeqs   int
	maxBatch  int
	progress  bool
	logLevel  string
}

func newDemoFlags(d *demoFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvbench demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d.wl.register(fs, demoMaxRequests, demoSpeedup)
	fs.IntVar(&d.workers, "workers", 4, "simulated vLLM workers (kvsim)")
	fs.StringVar(&d.modes, "modes", "round_robin,kv", "router modes to compare, in order (valid: "+strings.Join(scoring.ModeNames(), ", ")+")")
	fs.StringVar(&d.jsonOut, "json", "", "write the JSON report here (default: report.json in --out-dir)")
	fs.StringVar(&d.outDir, "out-dir", "", "folder for report.json, report.md and chart.svg (default: a new folder under the system temp dir)")
	fs.IntVar(&d.blockSize, "block-size", demoBlockSize, "tokens per KV block in the workers")
	fs.IntVar(&d.kvBlocks, "kv-blocks", demoKVBlocks, "KV cache blocks per worker (default ≈ Qwen3-8B on an 80 GB H100)")
	fs.IntVar(&d.maxSeqs, "max-num-seqs", sim.DefaultMaxNumSeqs, "maximum running requests per worker")
	fs.IntVar(&d.maxBatch, "max-num-batched-tokens", sim.DefaultMaxNumBatchedTokens, "maximum tokens per engine step (chunked prefill)")
	fs.BoolVar(&d.progress, "progress", false, "draw a progress bar on stderr even when it is not a terminal")
	fs.StringVar(&d.logLevel, "log-level", "off", "component logs on stderr: off, debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `kvbench demo runs kvroute end to end in one process and compares router modes.

It starts an embedded NATS server and etcd, --workers simulated vLLM workers
(kvsim: paged KV cache with prefix caching, continuous batching, the Dynamo
mocker's timing model), a kvroute router (ext_proc gRPC) and the Envoy
stand-in loaded from the cluster-header bootstrap. It then replays the
workload once per mode: before each mode the fleet goes idle, every worker's
cache is cleared and the router's mode is switched through /admin/mode, so
every mode starts cold. By default it replays the first --max-requests of the
bundled Mooncake conversation trace (token-id prompts, one deterministic
512-token block per hash id) --speedup times faster than recorded; the
workers run --speedup times faster too, so the load matches the trace.

It prints a table per mode (hit rate = Σ cached_tokens ÷ Σ prompt_tokens from
the workers' usage, TTFT/ITL/E2E percentiles, output tokens/s, which worker
served what) and the reference hit rates of the workload, and writes
report.json, report.md and chart.svg.

Flags:
`)
		fs.PrintDefaults()
	}
	return fs
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var d demoFlags
	fs := newDemoFlags(&d, stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	modes := splitList(d.modes)
	if len(modes) == 0 {
		return fmt.Errorf("--modes is empty")
	}
	for _, m := range modes {
		if _, err := scoring.NewMode(m, scoring.DefaultOptions()); err != nil {
			return err
		}
	}
	log, err := logger(stderr, d.logLevel)
	if err != nil {
		return err
	}
	wl, arr, err := d.wl.build()
	if err != nil {
		return err
	}
	outDir := d.outDir
	if outDir == "" {
		if outDir, err = os.MkdirTemp("", "kvbench-demo-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	jsonPath := d.jsonOut
	if jsonPath == "" {
		jsonPath = filepath.Join(outDir, "report.json")
	}

	engine := sim.EngineConfig{NumGPUBlocks: d.kvBlocks, BlockSize: d.blockSize, MaxNumSeqs: d.maxSeqs, MaxNumBatchedTokens: d.maxBatch}
	if err := engine.Validate(); err != nil {
		return err
	}
	ideal, haveIdeal := bench.IdealHitRates(wl, d.blockSize, d.workers*d.kvBlocks)
	setup := map[string]any{
		"workers": d.workers, "block_size": d.blockSize, "kv_blocks_per_worker": d.kvBlocks,
		"max_num_seqs": d.maxSeqs, "max_num_batched_tokens": d.maxBatch, "worker_speedup": d.wl.speedup,
		"gateway": "envoytest.Gateway with cluster-header bootstrap", "timing": "Dynamo mocker polynomial",
	}
	rep := bench.NewReport(wl, ideal, haveIdeal, setup)
	if d.wl.speedup != 1 {
		rep.Note = fmt.Sprintf("Times are wall-clock with arrivals and the simulated GPUs both %g× faster than real time; multiply by %g for simulated GPU time.",
			d.wl.speedup, d.wl.speedup)
	}

	fmt.Fprintf(stdout, "kvbench demo: %d requests (%s), %d kvsim workers × %d blocks of %d tokens, speedup %g, modes %s\n",
		wl.Requests(), wl.Name, d.workers, d.kvBlocks, d.blockSize, d.wl.speedup, strings.Join(modes, ", "))
	t0 := time.Now()
	env, err := bench.StartEnv(ctx, bench.EnvConfig{
		Workers: d.workers, Model: d.wl.model, Engine: engine, Speedup: d.wl.speedup,
		TokenizerDir: d.wl.tokenizer, Mode: modes[0], Logger: log,
	})
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintf(stdout, "system up in %.1fs: gateway %s, kvroute ext_proc %s, admin %s\n",
		time.Since(t0).Seconds(), env.URL(), env.Router.GRPCAddr(), env.RouterURL())

	client := bench.NewClient(env.URL())
	defer client.Close()
	ab := bench.ABOptions{Modes: modes, Run: bench.RunOptions{Arrival: arr, Duration: d.wl.duration},
		OnMode: func(mode string, m *bench.ModeResult) {
			fmt.Fprintf(stdout, "  %-18s %d requests, %d errors, hit rate %.1f%%, TTFT p90 %.0f ms, %.1fs\n",
				mode, m.Requests, m.Errors, 100*m.HitRate, m.TTFT.P90, m.WallSeconds)
			if m.FirstError != "" {
				fmt.Fprintf(stdout, "    first error: %s\n", m.FirstError)
			}
		}}
	if d.progress || bench.IsTerminal(os.Stderr) {
		ab.Progress = stderr
	}
	if err := bench.RunAB(ctx, env, client, wl, rep, ab); err != nil {
		return err
	}
	return writeReports(stdout, rep, jsonPath, outDir)
}

// writeReports prints the table and writes JSON, Markdown and SVG.
func writeReports(stdout io.Writer, rep *bench.Report, jsonPath, outDir string) error {
	md := rep.Markdown()
	fmt.Fprintf(stdout, "\n%s\n", md)
	if err := rep.WriteJSONFile(jsonPath); err != nil {
		return err
	}
	mdPath := filepath.Join(outDir, "report.md")
	if err := os.WriteFile(mdPath, []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	svgPath := filepath.Join(outDir, "chart.svg")
	if err := rep.WriteSVGFile(svgPath); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "report: %s\ntable:  %s\nchart:  %s\n", jsonPath, mdPath, svgPath)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
