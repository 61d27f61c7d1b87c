package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/kvroute/kvroute/internal/cli"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/vsim"
	"github.com/kvroute/kvroute/scoring"
)

// Demo defaults. The simulated GPU is Qwen3-8B in bf16 on one 80 GB H100:
// 36 layers × 8 KV heads × 128 dims × 2 (K and V) × 2 bytes = 144 KiB of KV
// per token; after 16 GB of weights and vLLM's 0.9 memory utilization about
// 52 GB are left for KV, ≈ 360k tokens = 5,632 blocks of 64 tokens. 64-token
// blocks are the Dynamo mocker's default (vLLM's CUDA default is 16; larger
// blocks only coarsen matching, and keep the event volume of 13k-token
// prompts manageable on two cores).
// progressEvery is the period of the progress lines on a non-terminal.
const progressEvery = 5 * time.Second

const (
	demoBlockSize   = sim.DefaultBlockSize
	demoKVBlocks    = 5632
	demoMaxRequests = 800
	demoSpeedup     = 1
	demoWorkers     = 8
	demoLoad        = 8
	// The sweep shows where the modes part; the real-time run then checks
	// one load near round robin's knee on the real stack.
	demoSweepLoads = "1,2,4,8,16"
	demoSweepModes = "kv,round_robin,least_loaded"
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
	log       *cli.LogFlags
	sweep     string
	sweepWL   string
	timing    string
}

func newDemoFlags(d *demoFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvbench demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d.wl.register(fs, demoMaxRequests, demoSpeedup)
	// The demo's own defaults: agent sessions at a load near round robin's
	// knee on the default fleet.
	d.wl.kind, d.wl.agentLoad = "agent", demoLoad
	fs.Lookup("workload").DefValue = "agent"
	fs.Lookup("load").Usage += "; default " + strconv.Itoa(demoLoad) + " for the agent workload"
	fs.IntVar(&d.workers, "workers", demoWorkers, "simulated vLLM workers (kvsim)")
	fs.StringVar(&d.sweep, "sweep-loads", demoSweepLoads, "before the real-time run, sweep these loads in virtual time (kvbench sim) for "+demoSweepModes+" on --workers workers; empty skips the sweep")
	fs.StringVar(&d.sweepWL, "sweep-workload", "agent", "workload of the virtual-time sweep: "+strings.Join(simWorkloads, ", "))
	fs.StringVar(&d.modes, "modes", "round_robin,kv", "router modes to compare, in order (valid: "+strings.Join(scoring.ModeNames(), ", ")+")")
	fs.StringVar(&d.jsonOut, "json", "", "write the JSON report here (default: report.json in --out-dir)")
	fs.StringVar(&d.outDir, "out-dir", "demo-out", "`folder` for sweep.{json,md,svg}, report.{json,md} and chart.svg, created if missing; files of an earlier run are replaced")
	fs.IntVar(&d.blockSize, "block-size", demoBlockSize, "tokens per KV block in the workers")
	fs.IntVar(&d.kvBlocks, "kv-blocks", demoKVBlocks, "KV cache blocks per worker (default ≈ Qwen3-8B on an 80 GB H100)")
	fs.IntVar(&d.maxSeqs, "max-num-seqs", sim.DefaultMaxNumSeqs, "maximum running requests per worker")
	fs.IntVar(&d.maxBatch, "max-num-batched-tokens", sim.DefaultMaxNumBatchedTokens, "maximum tokens per engine step (chunked prefill)")
	timingFlag(fs, &d.timing)
	fs.BoolVar(&d.progress, "progress", false, "draw a progress bar on stderr even when it is not a terminal (otherwise one line every 5 s there)")
	d.log = cli.RegisterLog(fs, "off")
	setUsage(fs, fmt.Sprintf(`kvbench demo compares router modes in two parts.

Part 1, in virtual time (seconds of CPU, no network): the --sweep-workload
workload (default agent: multi-turn agent sessions) at each of --sweep-loads
(default %s) for %s on --workers simulated workers,
through kvroute's real scheduler and KV index (kvbench sim). It writes
sweep.json, sweep.md and sweep.svg. --sweep-loads "" skips it.

Part 2, in real time: the --workload workload (default agent, whole sessions
up to --max-requests, default %d, at --load, default %d for agent) through the
real stack in one process: an embedded NATS server and etcd, --workers kvsim
workers (paged KV cache with prefix caching, continuous batching, the --timing
step-time model, --speedup times faster than a GPU), a kvroute router
(ext_proc gRPC) and a real Envoy running the cluster-header bootstrap
(KVROUTE_ENVOY, the copy "make envoy" installs, or envoy on the PATH). It
replays the workload once per mode in --modes: before each mode the fleet goes
idle, every worker's cache is cleared and the router's mode is switched
through /admin/mode, so every mode starts cold. --workload trace replays the
bundled Mooncake conversation trace instead.

It prints a table per mode (hit rate = Σ cached_tokens ÷ Σ prompt_tokens from
the workers' usage, TTFT/ITL/E2E percentiles with p50, p90 and p99, output
tokens/s, which worker served what) and the reference hit rates of the
workload, and writes report.json, report.md and chart.svg.

Both parts use --timing: the Dynamo mocker's polynomial by default, or a GPU
profile (h100-llama3-8b, or a profile file) that charges cached context.`, demoSweepLoads, strings.ReplaceAll(demoSweepModes, ",", ", "), demoMaxRequests, demoLoad))
	return fs
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var d demoFlags
	fs := newDemoFlags(&d, stderr)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	d.wl.parsed(fs)
	timing, err := parseTiming(d.timing)
	if err != nil {
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
	log, err := d.log.Logger(stderr)
	if err != nil {
		return err
	}
	d.wl.blockSize = d.blockSize
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
	if abs, err := filepath.Abs(outDir); err == nil {
		outDir = abs
	}
	fmt.Fprint(stdout, d.plan(wl.Name, wl.Requests(), modes, outDir))

	engine := sim.EngineConfig{NumGPUBlocks: d.kvBlocks, BlockSize: d.blockSize, MaxNumSeqs: d.maxSeqs, MaxNumBatchedTokens: d.maxBatch}
	if err := engine.Validate(); err != nil {
		return err
	}
	ideal, haveIdeal := bench.IdealHitRates(wl, d.blockSize, d.workers*d.kvBlocks)
	setup := map[string]any{
		"workers": d.workers, "block_size": d.blockSize, "kv_blocks_per_worker": d.kvBlocks,
		"max_num_seqs": d.maxSeqs, "max_num_batched_tokens": d.maxBatch, "worker_speedup": d.wl.speedup, "load": d.wl.load,
		"gateway": "Envoy with the cluster-header bootstrap", "timing": vsim.TimingLabel(timing),
	}
	rep := bench.NewReport(wl, ideal, haveIdeal, setup)
	if d.wl.speedup != 1 {
		rep.Note = fmt.Sprintf("Times are wall-clock with arrivals and the simulated GPUs both %g× faster than real time; multiply by %g for simulated GPU time.",
			d.wl.speedup, d.wl.speedup)
	}

	if d.sweep != "" {
		if err := d.runSweep(stdout, stderr, engine, timing, outDir); err != nil {
			return err
		}
	}
	for _, n := range d.wl.notes {
		fmt.Fprintln(stdout, n)
	}
	fmt.Fprintf(stdout, "kvbench demo: %d requests (%s), %d kvsim workers × %d blocks of %d tokens, timing %s, speedup %g, load %g, modes %s\n",
		wl.Requests(), wl.Name, d.workers, d.kvBlocks, d.blockSize, timing.Name(), d.wl.speedup, d.wl.load, strings.Join(modes, ", "))
	t0 := time.Now()
	env, err := bench.StartEnv(ctx, bench.EnvConfig{
		Workers: d.workers, Model: d.wl.model, Engine: engine, Timing: timing, Speedup: d.wl.speedup,
		TokenizerDir: d.wl.tokenizer, Mode: modes[0], Logger: log,
		ChatTemplate: d.wl.chatTemplate, MMFamily: d.wl.mmFamily,
	})
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintf(stdout, "system up in %.1fs: Envoy %s (admin %s), kvroute ext_proc %s, admin %s\n",
		time.Since(t0).Seconds(), env.URL(), env.Envoy.AdminURL(), env.Router.GRPCAddr(), env.AdminURL())

	client := bench.NewClient(env.URL())
	defer client.Close()
	ab := bench.ABOptions{Modes: modes, Run: bench.RunOptions{Arrival: arr, Duration: d.wl.duration},
		OnMode: func(mode string, m *bench.ModeResult) {
			fmt.Fprintf(stdout, "  %-18s %d requests, %d errors, hit rate %.1f%%, TTFT p50 / p90 / p99 %.0f / %.0f / %.0f ms, %.1fs\n",
				mode, m.Requests, m.Errors, 100*m.HitRate, m.TTFT.P50, m.TTFT.P90, m.TTFT.P99, m.WallSeconds)
			if m.FirstError != "" {
				fmt.Fprintf(stdout, "    first error: %s\n", m.FirstError)
			}
			if m.LagWarning {
				id, secs := m.WorstLag()
				fmt.Fprintf(stdout, "    warning: kvsim worker %s fell %.2f s behind real time: this mode's times are unreliable, and the summary compares no latencies (lower --speedup, --workers or --load, or free CPU)\n", id, secs)
			}
		}}
	ab.Progress = stderr
	if !d.progress && !bench.IsTerminal(os.Stderr) {
		ab.ProgressEvery = progressEvery
	}
	if err := bench.RunAB(ctx, env, client, wl, rep, ab); err != nil {
		return err
	}
	if err := writeReports(stdout, rep, jsonPath, outDir); err != nil {
		return err
	}
	listFiles(stdout, outDir)
	return nil
}

// plan is the demo's first screen: what each part runs, from the flags as
// given, so that it never describes a run other than the one that follows.
func (d *demoFlags) plan(workload string, requests int, modes []string, outDir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kvbench demo: reports go to %s\n", outDir)
	part := 1
	if d.sweep != "" {
		fmt.Fprintf(&b, "  part %d, virtual time: the %s workload at loads %s for %s on %d simulated workers (kvroute's scheduler and KV index, no network)\n",
			part, d.sweepWL, d.sweep, strings.ReplaceAll(demoSweepModes, ",", ", "), d.workers)
		part++
	}
	fmt.Fprintf(&b, "  part %d, real time: the %s workload (%d requests, load %g) through embedded NATS and etcd, %d kvsim workers, kvroute and a real Envoy, once per mode: %s\n",
		part, workload, requests, d.wl.load, d.workers, strings.Join(modes, ", "))
	return b.String()
}

// listFiles prints the files the demo left in dir, so the reader knows where
// to look.
func listFiles(stdout io.Writer, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	fmt.Fprintf(stdout, "\nkvbench demo wrote %d files in %s: %s\n", len(names), dir, strings.Join(names, ", "))
}

// runSweep runs the virtual-time sweep the demo opens with and writes
// sweep.json, sweep.md and sweep.svg into outDir.
func (d *demoFlags) runSweep(stdout, stderr io.Writer, engine sim.EngineConfig, timing sim.Timing, outDir string) error {
	loads, err := parseLoads(d.sweep)
	if err != nil {
		return fmt.Errorf("--sweep-loads: %w", err)
	}
	w, err := simWorkload(d.sweepWL, "", 0, vsim.FormatMooncake, workloadSize{})
	if err != nil {
		return err
	}
	fleet := vsim.DefaultFleet()
	fleet.Workers, fleet.Engine, fleet.Timing = d.workers, engine, timing
	modes := splitList(demoSweepModes)
	fmt.Fprintf(stdout, "kvbench demo, part 1: %s workload in virtual time (kvbench sim), %d workers, modes %s, loads %s\n",
		w.Name, d.workers, strings.Join(modes, ", "), d.sweep)
	t0 := time.Now()
	opt := vsim.SweepOptions{Fleet: fleet, Router: scoring.DefaultOptions(), Modes: modes, Loads: loads, SLO: 2 * time.Second, Seed: d.wl.seed}
	prog := bench.NewProgress(stderr, "sweep", len(modes)*len(loads))
	if !d.progress && !bench.IsTerminal(os.Stderr) {
		prog = bench.NewProgressLines(stderr, "sweep", len(modes)*len(loads), progressEvery)
	}
	prog.Counting("runs (one mode at one load each)")
	opt.Progress = func(done, _ int, _ vsim.Result) { prog.Update(done, 0) }
	defer prog.Done()
	rep, err := vsim.Sweep(w, opt)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n%s\nsweep: %s (%.0fs)\n\nkvbench demo, part 2: real time, through kvroute and a real Envoy\n",
		rep.Markdown(), filepath.Join(outDir, "sweep.json"), time.Since(t0).Seconds())
	return rep.WriteFile(filepath.Join(outDir, "sweep.json"))
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
