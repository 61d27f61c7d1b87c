package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/cli"
)

func runHop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench hop", flag.ContinueOnError)
	rates := fs.String("rates", "200,1000,2000", "offered request rates per second, comma-separated")
	duration := fs.Duration("duration", 5*time.Second, "how long each rate is offered to each path per round")
	rounds := fs.Int("rounds", 3, "rounds per rate; each round offers the rate to both paths, one after the other")
	workers := fs.Int("workers", 4, "upstreams that answer at once")
	tok := fs.String("tokenizer", "tokenizer/testdata/qwen3", "`DIR` of the router's tokenizer")
	prompts := fs.String("prompts", "short,8k,stream", "prompt kinds: short (a one-line chat), 8k (about 8,000 tokens, unique per request) and stream (the short chat answered as 64 chunks 20 ms apart: time to first byte and the gap between chunks)")
	reqOnly := fs.Bool("request-path-only", false, "take kvroute off the response path (Envoy sends it no response headers or body): what load bookkeeping costs")
	style := fs.String("style", "cluster-header", "bootstrap both Envoys run: cluster-header (request body BUFFERED) or original-dst (request body FULL_DUPLEX_STREAMED; without kvroute the client names the worker, round robin)")
	respPath := fs.String("response-path", bench.ResponsePathObserved, "what of each response the routed Envoy sends kvroute and how: observed (the default bootstraps: one exchange Envoy waits on), headers (request and response headers on the routing stream) or streamed (every body chunk too); kvroute envoy-config --response-path")
	jsonOut := fs.String("json", "", "also write the report as JSON to this `file`")
	logf := cli.RegisterLog(fs, "off")
	setUsage(fs, `kvbench hop measures what kvroute adds to a request's path through Envoy.

It starts --workers upstreams that answer a chat completion at once, a kvroute
router (workers file, embedded NATS, the --tokenizer), and two real Envoys
running the same bootstrap (--style): one with kvroute as its ext_proc
filter, one without it (cluster-header: round robin; original-dst: the
client names the worker, round robin). Each rate is offered open-loop to both
Envoys in turn, --rounds times, and the table shows both paths' latency
percentiles over all rounds and their difference: the time kvroute adds
(the ext_proc round trips, parsing, tokenizing, matching and picking).
For streamed answers (--prompts stream: 64 chunks, 20 ms apart upstream) it
shows the time to first byte and the gap between chunks instead.

A second table gives the cost per routed request, which shows a regression
without a timing run: the ext_proc messages Envoy held the request for, by
phase (kvroute_extproc_exchanges_total), kvroute's CPU time (kvbench's own
process, which runs kvroute, on the routed path minus on the baseline) and
each Envoy's CPU time (/proc/<pid>/stat). Everything shares this machine's
cores, the load generator included: compare the two paths within one run.`)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *style != "cluster-header" && *style != "original-dst" {
		return cli.Usagef("--style %q: want cluster-header or original-dst", *style)
	}
	if !slices.Contains(bench.ResponsePaths, *respPath) {
		return cli.Usagef("--response-path %q: want %s", *respPath, cli.List(bench.ResponsePaths, "or"))
	}
	var rs []float64
	for _, f := range splitList(*rates) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0) {
			return cli.Usagef("--rates %q: each value must be a positive number", f)
		}
		rs = append(rs, v)
	}
	log, err := logf.Logger(stderr)
	if err != nil {
		return err
	}
	rep, err := bench.RunHop(ctx, bench.HopConfig{Workers: *workers, TokenizerDir: *tok, Rates: rs, Duration: *duration,
		Rounds: *rounds, Prompts: splitList(*prompts), RequestPathOnly: *reqOnly, ResponsePath: *respPath, Style: *style, Logger: log, Progress: stderr})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Envoy %s; style %s; response path %s; %d rounds of %s per rate and path\n\n%s", rep.Envoy, *style, *respPath, *rounds, *duration, rep.Markdown())
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}
