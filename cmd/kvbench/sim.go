package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/costflag"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/vsim"
	"github.com/kvroute/kvroute/scoring"
)

// simWorkloads are the workloads kvbench sim builds by name.
var simWorkloads = []string{"agent", "burst", "conversation", "synthetic", "shared_prefix", "no_reuse"}

// simFlags are kvbench sim's settings.
type simFlags struct {
	workload    string
	trace       string
	traceBlock  int
	traceFormat string
	exportTrace string
	exportBlock int
	fleet       vsim.Fleet
	modes       string
	loads       string
	slo         time.Duration
	seed        uint64
	jsonOut     string
	parallel    int
	router      scoring.Options
	cost        *costflag.Flags
	size        workloadSize
	routerCost  bool
	requestsOut string
	explainReqs string
	explainOut  string
	timing      string
	cpuProfile  string
}

// workloadSize overrides a generated workload's size: sessions (requests
// of the single-turn ones) and their arrival rate at load 1; zero keeps
// the workload's own.
type workloadSize struct {
	sessions int
	rate     float64
}

func newSimFlags(s *simFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvbench sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	s.fleet = vsim.DefaultFleet()
	s.router = scoring.DefaultOptions()
	fs.StringVar(&s.workload, "workload", "agent", "workload by name: "+strings.Join(simWorkloads, ", ")+
		" (conversation and synthetic are the whole bundled Mooncake traces)")
	fs.StringVar(&s.trace, "trace", "", "Mooncake-format trace `file` to replay instead of --workload (every record is used)")
	fs.IntVar(&s.traceBlock, "trace-block-size", bench.DefaultTraceBlockSize, "tokens per hash id in --trace")
	fs.StringVar(&s.traceFormat, "trace-format", vsim.FormatMooncake, "how --trace's rows of one session_id build prompts: "+
		vsim.FormatMooncake+" (each row's hash_ids are the whole prompt) or "+vsim.FormatMooncakeDelta+
		" (a later turn's hash_ids follow the history: the previous prompt and its output)")
	fs.StringVar(&s.exportTrace, "export-trace", "", "write the workload to this `file` as a Mooncake trace with sessions "+
		"(session_id; timestamp on first turns, delay after the previous turn on later ones) and exit without simulating")
	fs.IntVar(&s.exportBlock, "export-block-size", 0, "tokens per hash id in --export-trace (0: --block-size)")
	fs.IntVar(&s.fleet.Workers, "workers", s.fleet.Workers, "simulated workers")
	fs.IntVar(&s.fleet.Engine.NumGPUBlocks, "kv-blocks", s.fleet.Engine.NumGPUBlocks, "KV blocks per worker")
	fs.IntVar(&s.fleet.Engine.BlockSize, "block-size", s.fleet.Engine.BlockSize, "tokens per KV block")
	fs.IntVar(&s.fleet.Engine.MaxNumBatchedTokens, "max-num-batched-tokens", 8192, "tokens an engine step schedules at most")
	timingFlag(fs, &s.timing)
	fs.DurationVar(&s.fleet.EventLag, "event-lag", s.fleet.EventLag, "delay from an engine step to its KV events reaching the router's index")
	fs.DurationVar(&s.fleet.ReportEvery, "load-report-interval", s.fleet.ReportEvery, "period of the workers' load reports")
	fs.StringVar(&s.modes, "modes", "kv,round_robin,least_loaded", "comma-separated router modes: "+strings.Join(scoring.ModeNames(), ", "))
	fs.StringVar(&s.loads, "load", "0.5,1,2,4,8,16", "comma-separated arrival-rate multipliers over the workload's own timestamps (ascending)")
	fs.DurationVar(&s.slo, "slo-ttft-p90", 2*time.Second, "TTFT p90 target that defines goodput: the highest load that meets it")
	fs.Uint64Var(&s.seed, "seed", 1, "seed of the router's tie-breaks and sampling: the same seed gives the same report")
	fs.StringVar(&s.jsonOut, "json", "", "write the JSON report to this `file`, with the Markdown (.md) and the chart (.svg) beside it")
	fs.IntVar(&s.parallel, "parallel", 0, "simulations run at once (0: one per CPU); the report does not depend on it")
	fs.IntVar(&s.size.sessions, "sessions", 0, "sessions of agent and burst, requests of shared_prefix and no_reuse (0: the workload's own)")
	fs.Float64Var(&s.size.rate, "rate", 0, "sessions (agent) or requests (shared_prefix, no_reuse) per second at load 1 (0: the workload's own); "+
		"with --sessions, sizes a workload for a larger fleet")
	fs.StringVar(&s.requestsOut, "requests-out", "", "write every request of every run to this `file` as JSON lines: mode, load, worker, arrival, "+
		"prompt, cached and predicted cached tokens, TTFT, and its floor (ttft_floor_ms: the same prompt alone on an idle worker with the hits it got, "+
		"so TTFT minus floor is what queueing cost it and only more hits lower the floor)")
	fs.StringVar(&s.explainReqs, "explain-requests", "", "explain the router's decision for these `requests` (indices in the workload's arrival order, "+
		"as --requests-out numbers them, comma-separated) in every run, written to --explain-out: every candidate's terms, as POST /debug/explain shows them")
	fs.StringVar(&s.explainOut, "explain-out", "", "write the decisions --explain-requests names to this `file` as JSON lines: mode, load, request, "+
		"the simulated time of the decision (at_ms) and the explanation")
	fs.BoolVar(&s.routerCost, "router-cost", false, "also measure the router's CPU (index match, decisions, lifecycle, load reports, KV events), "+
		"the event rate and the index's size, apart from the engines; with --parallel 1 also the index's heap. Timings vary from run to run")
	fs.StringVar(&s.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the runs to this `file` (go tool pprof reads it); "+
		"the engines are in it too")
	s.cost = costflag.Register(fs, &s.router)
	setUsage(fs, `kvbench sim replays a workload through kvroute's real scoring (pool, cost
model, admission queue), its real KV index (events go through the real vLLM
msgpack encoder and decoder, --event-lag late) and simulated vLLM engines, in
virtual time: no sleeping, no sockets, one goroutine per run. Every mode runs at
every load; a run is deterministic, so the same command prints the same report.

It reports, per mode and load: the prefix-cache hit rate the engines saw, TTFT,
inter-token and end-to-end latency, the hit rate of sessions' first turns and
of their later turns, stickiness (follow-ups sent to a worker that held their
previous request's prefix), same worker (later turns sent to the worker of the
turn before), overlap_exact (predicted cached tokens ==
what the engine reported), and the goodput: the highest load whose TTFT p90
meets --slo-ttft-p90.

Engine step times come from --timing: the Dynamo mocker's polynomial by
default (cached context is free; use it to compare with Dynamo's replay), or a
GPU profile that charges attention over cached context and the KV each decode
step reads (the built-in h100-llama3-8b, or a profile file). Reports name the
timing they ran under.`)
	return fs
}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s simFlags
	fs := newSimFlags(&s, stderr)
	err := parse(fs, args, stdout)
	if err != nil {
		return err
	}
	if err := s.cost.Finish(stderr); err != nil {
		return err
	}
	if s.fleet.Timing, err = parseTiming(s.timing); err != nil {
		return err
	}
	modes := splitList(s.modes)
	loads, err := parseLoads(s.loads)
	if err != nil {
		return err
	}
	explain, err := parseExplain(s.explainReqs, s.explainOut)
	if err != nil {
		return err
	}
	w, err := s.buildWorkload()
	if err != nil {
		return err
	}
	if s.exportTrace != "" {
		return s.export(w, stderr)
	}
	opt := vsim.SweepOptions{Fleet: s.fleet, Router: s.router, Modes: modes, Loads: loads, SLO: s.slo, Seed: s.seed, Parallel: s.parallel,
		RouterCost: s.routerCost, Requests: s.requestsOut != "", Explain: explain}
	prog := bench.NewProgress(stderr, "sim "+w.Name, len(modes)*len(loads)).Counting("runs (one mode at one load each)")
	opt.Progress = func(done, _ int, _ vsim.Result) { prog.Update(done, 0) }
	stop, err := startCPUProfile(s.cpuProfile)
	if err != nil {
		return err
	}
	rep, err := vsim.Sweep(w, opt)
	stop()
	prog.Done()
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, rep.Markdown())
	if s.jsonOut != "" {
		if err := rep.WriteFile(s.jsonOut); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s and its .md and .svg\n", s.jsonOut)
	}
	if s.requestsOut != "" {
		if err := writeJSONLines(s.requestsOut, "requests out", rep.Records); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s: %d requests\n", s.requestsOut, len(rep.Records))
	}
	if s.explainOut != "" {
		if err := writeJSONLines(s.explainOut, "explain out", rep.Explains); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s: %d decisions\n", s.explainOut, len(rep.Explains))
	}
	return ctx.Err()
}

// startCPUProfile starts a CPU profile written to path, when path is set,
// and returns the function that ends it.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

func (s *simFlags) buildWorkload() (*vsim.Workload, error) {
	if s.size != (workloadSize{}) && s.trace != "" {
		return nil, fmt.Errorf("--sessions and --rate size a generated workload, not --trace")
	}
	return simWorkload(s.workload, s.trace, s.traceBlock, s.traceFormat, s.size)
}

// export writes w as a Mooncake trace with sessions to --export-trace.
func (s *simFlags) export(w *vsim.Workload, stderr io.Writer) error {
	bs := s.exportBlock
	if bs == 0 {
		bs = s.fleet.Engine.BlockSize
	}
	sessions, err := w.MooncakeSessions(s.fleet.Engine, bs)
	if err != nil {
		return err
	}
	f, err := os.Create(s.exportTrace)
	if err != nil {
		return fmt.Errorf("export trace: %w", err)
	}
	if err := bench.WriteSessionTrace(f, sessions); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("export trace: %w", err)
	}
	fmt.Fprintf(stderr, "wrote %s: %d sessions, %d requests, %d tokens per hash id (replay it with --trace-block-size %d)\n",
		s.exportTrace, len(sessions), w.Requests(), bs, bs)
	return nil
}

// simWorkload builds a simulation workload: a Mooncake trace file (with or
// without sessions, in format) when trace is set, else the workload named
// (see simWorkloads).
func simWorkload(name, trace string, traceBlock int, format string, size workloadSize) (*vsim.Workload, error) {
	if size.sessions < 0 || size.rate < 0 {
		return nil, fmt.Errorf("--sessions %d and --rate %g must not be negative", size.sessions, size.rate)
	}
	if trace != "" {
		sessions, err := bench.ReadSessionTraceFile(trace, traceBlock)
		if err != nil {
			return nil, err
		}
		return vsim.SessionTraceWorkload(trace, sessions, traceBlock, format)
	}
	switch name {
	case "agent":
		o := vsim.DefaultAgentOptions()
		size.apply(&o.Sessions, &o.Rate)
		return vsim.AgentWorkload(o)
	case "burst":
		if size.rate != 0 {
			return nil, fmt.Errorf("--rate: the burst workload starts every session within its window")
		}
		o := vsim.DefaultBurstOptions()
		size.apply(&o.Sessions, nil)
		return vsim.BurstWorkload(o)
	case "shared_prefix":
		o := vsim.DefaultSharedPrefixOptions()
		size.apply(&o.Requests, &o.Rate)
		return vsim.SharedPrefixWorkload(o)
	case "no_reuse":
		o := vsim.DefaultNoReuseOptions()
		size.apply(&o.Requests, &o.Rate)
		return vsim.NoReuseWorkload(o)
	case "conversation", "synthetic":
		if size != (workloadSize{}) {
			return nil, fmt.Errorf("--sessions and --rate size a generated workload; %s is a trace", name)
		}
		recs, err := bench.NamedTrace(name)
		if err != nil {
			return nil, err
		}
		return vsim.TraceWorkload(name, recs, bench.DefaultTraceBlockSize), nil
	}
	return nil, fmt.Errorf("unknown workload %q (valid: %s)", name, strings.Join(simWorkloads, ", "))
}

// apply sets the workload's own count and rate where size overrides them.
func (size workloadSize) apply(n *int, rate *float64) {
	if size.sessions > 0 {
		*n = size.sessions
	}
	if size.rate > 0 && rate != nil {
		*rate = size.rate
	}
}

// timingFlag registers --timing, the engines' step-time model.
func timingFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "timing", sim.TimingPolynomial, sim.TimingUsage)
}

// parseTiming resolves --timing: a name (sim.TimingNames) or a profile file.
func parseTiming(s string) (sim.Timing, error) {
	t, err := sim.ParseTiming(s)
	if err != nil {
		return nil, cli.Usagef("--timing: %w", err)
	}
	return t, nil
}

func parseLoads(s string) ([]float64, error) {
	var out []float64
	for _, f := range splitList(s) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("--load %q: each value must be a positive number", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--load is empty")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// parseExplain reads --explain-requests, which needs --explain-out and
// the other way round.
func parseExplain(list, out string) (map[int]bool, error) {
	if (list == "") != (out == "") {
		return nil, fmt.Errorf("--explain-requests and --explain-out go together")
	}
	if list == "" {
		return nil, nil
	}
	m := map[int]bool{}
	for _, f := range splitList(list) {
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("--explain-requests %q: each value must be a request index, 0 or more", f)
		}
		m[v] = true
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("--explain-requests is empty")
	}
	return m, nil
}

// writeJSONLines writes recs to path as JSON lines; what names the flag
// in errors.
func writeJSONLines[T any](path, what string, recs []T) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			_ = f.Close()
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := bw.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
