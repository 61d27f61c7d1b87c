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

	"github.com/kvroute/kvroute/discovery/file"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
)

// replayFlags are kvbench replay's settings.
type replayFlags struct {
	wl        workloadFlags
	url       string
	label     string
	jsonOut   string
	outDir    string
	blockSize int
	capacity  int
	workers   string
	progress  bool
}

func newReplayFlags(r *replayFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvbench replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	r.wl.register(fs, 0, 1)
	fs.StringVar(&r.url, "url", "http://127.0.0.1:8080", "base URL of the OpenAI endpoint (Envoy in front of kvroute, or a single server)")
	fs.StringVar(&r.label, "label", "run", "name of this run in the report (e.g. the router mode under test)")
	fs.StringVar(&r.jsonOut, "json", "", "write the JSON report here (default: report.json in --out-dir)")
	fs.StringVar(&r.outDir, "out-dir", ".", "folder for report.json, report.md and chart.svg")
	fs.StringVar(&r.workers, "workers-file", "", "the fleet's workers `file` (kvsim --workers-file, kvroute --workers-file): --block-size and --capacity-blocks default to its block_size and total kv_total_blocks")
	fs.IntVar(&r.blockSize, "block-size", sim.DefaultBlockSize, "the workers' tokens per KV block, for the reference hit rates (default: from --workers-file, else kvsim's)")
	fs.IntVar(&r.capacity, "capacity-blocks", 0, "the fleet's total KV blocks, for the fleet-capacity reference (default: from --workers-file, else not computed)")
	fs.BoolVar(&r.progress, "progress", false, "draw a progress bar on stderr even when it is not a terminal")
	setUsage(fs, `kvbench replay sends a workload to a running OpenAI-compatible endpoint and
measures it: TTFT, inter-token latency and end-to-end latency (p50/p90/p99/mean),
output tokens/s, requests/s, errors, the prefix-cache hit rate from usage
(Σ cached_tokens ÷ Σ prompt_tokens) and, for kvsim workers, which worker served
each request. Requests stream (stream_options.include_usage) and set ignore_eos.

To compare router modes against a deployed kvroute, run it once per mode
(POST /admin/mode?mode=NAME on kvroute, clear the workers' caches) with
--label NAME, or use "kvbench demo" for the all-embedded A/B.`)
	return fs
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var r replayFlags
	fs := newReplayFlags(&r, stderr)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	r.wl.parsed(fs)
	if err := r.fromWorkers(fs, stdout); err != nil {
		return err
	}
	r.wl.blockSize = r.blockSize
	wl, arr, err := r.wl.build()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.outDir, 0o755); err != nil {
		return err
	}
	jsonPath := r.jsonOut
	if jsonPath == "" {
		jsonPath = filepath.Join(r.outDir, "report.json")
	}
	ideal, haveIdeal := bench.IdealHitRates(wl, r.blockSize, r.capacity)
	rep := bench.NewReport(wl, ideal, haveIdeal, map[string]any{"url": r.url, "block_size": r.blockSize, "capacity_blocks": r.capacity,
		"speedup": r.wl.speedup, "load": r.wl.load})
	if r.capacity <= 0 {
		rep.IdealFleet = nil
	}
	client := bench.NewClient(strings.TrimRight(r.url, "/"))
	defer client.Close()
	ro := bench.RunOptions{Arrival: arr, Duration: r.wl.duration}
	var bar *bench.Progress
	if r.progress || bench.IsTerminal(os.Stderr) {
		bar = bench.NewProgress(stderr, r.label, wl.Requests())
		ro.Progress = bar.Update
	}
	for _, n := range r.wl.notes {
		fmt.Fprintln(stdout, n)
	}
	fmt.Fprintf(stdout, "kvbench replay: %d requests (%s, arrival %s) to %s\n", wl.Requests(), wl.Name, arr.Kind, r.url)
	start := time.Now()
	results, err := bench.Run(ctx, client, wl, ro)
	if bar != nil {
		bar.Done()
	}
	if err != nil {
		return err
	}
	m := bench.Measure(results, time.Since(start))
	rep.Add(r.label, &m)
	if m.FirstError != "" {
		fmt.Fprintf(stdout, "first error: %s\n", m.FirstError)
	}
	return writeReports(stdout, rep, jsonPath, r.outDir)
}

// fromWorkers fills --block-size and --capacity-blocks, where the command
// line and the environment left them, from --workers-file: the reference
// hit rates are only right at the workers' own block size.
func (r *replayFlags) fromWorkers(fs *flag.FlagSet, stdout io.Writer) error {
	if r.workers == "" {
		return nil
	}
	recs, err := file.Load(r.workers)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	bs, total := 0, 0
	for _, w := range recs {
		if bs != 0 && w.BlockSize != bs {
			return fmt.Errorf("%s: workers disagree on block_size (%d and %d); give --block-size", r.workers, bs, w.BlockSize)
		}
		bs = w.BlockSize
		total += w.KVTotalBlocks
	}
	if !set["block-size"] && bs > 0 {
		r.blockSize = bs
	}
	if !set["capacity-blocks"] {
		r.capacity = total
	}
	fmt.Fprintf(stdout, "kvbench replay: %d workers in %s: block size %d, %d KV blocks in all\n", len(recs), r.workers, r.blockSize, r.capacity)
	return nil
}
