//go:build llmdsim

package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/vsim"
)

// Agent workload timing: kvbench's agent sessions replayed this many times
// faster than their trace, on simulators whose step times are an H100-class
// engine's divided by the same factor (about 100 µs of prefill per token,
// 15 ms per output token), so the load is the trace's.
const (
	llmdAgentSpeedup  = 10
	llmdAgentRequests = 600
)

// BenchmarkLLMDAgent replays the first agentRequests requests of kvbench's
// agent workload (multi-turn agent sessions over shared system prompts,
// token-id prompts) through Envoy onto four fresh llm-d-inference-sim
// engines, once with kvroute in kv mode and once in round_robin, and
// reports each mode's prefix-cache hit rate (Σ cached ÷ Σ prompt tokens,
// from the engines' usage) and TTFT p90, and the ratio of the TTFT p90s.
// One iteration is one A/B run (-benchtime 1x).
func BenchmarkLLMDAgent(b *testing.B) {
	bin := os.Getenv("KVROUTE_LLMD_SIM")
	if bin == "" {
		b.Fatal("KVROUTE_LLMD_SIM is not set: run `make bench-llmd`, which builds llm-d-inference-sim (scripts/llm-d-sim.sh)")
	}
	aw, err := vsim.AgentWorkload(vsim.DefaultAgentOptions())
	if err != nil {
		b.Fatal(err)
	}
	simArgs := []string{"--kv-cache-size", "16384", "--max-num-seqs", "64", "--max-model-len", "65536",
		"--prefill-overhead", "2ms", "--prefill-time-per-token", "10us", "--inter-token-latency", "1500us"}
	for range b.N {
		got := map[string]bench.ModeResult{}
		for _, mode := range []string{"kv", "round_robin"} {
			got[mode] = runLLMDAgent(b, bin, aw, mode, simArgs)
		}
		kv, rr := got["kv"], got["round_robin"]
		ratio := rr.TTFT.P90 / kv.TTFT.P90
		b.Logf("agent workload, %d requests at %dx on 4 llm-d-inference-sim engines: hit rate kv %.3f vs round_robin %.3f; "+
			"TTFT p90 kv %.1f ms vs round_robin %.1f ms (round_robin / kv = %.2fx); overlap_exact kv %s; errors kv %d, round_robin %d",
			kv.Requests, llmdAgentSpeedup, kv.HitRate, rr.HitRate, kv.TTFT.P90, rr.TTFT.P90, ratio, share(kv.OverlapExact), kv.Errors, rr.Errors)
		b.ReportMetric(kv.HitRate, "kv-hit-rate")
		b.ReportMetric(rr.HitRate, "rr-hit-rate")
		b.ReportMetric(kv.TTFT.P90, "kv-ttft-p90-ms")
		b.ReportMetric(rr.TTFT.P90, "rr-ttft-p90-ms")
		b.ReportMetric(ratio, "rr/kv-ttft-p90")
	}
}

func share(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f %%", 100**p)
}

func runLLMDAgent(b *testing.B, bin string, aw *vsim.Workload, mode string, simArgs []string) bench.ModeResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := startLLMDFleet(b, ctx, bin, fleetOptions{mode: mode, simArgs: simArgs})
	defer f.close()
	wl := aw.BenchWorkload(sim.EngineConfig{BlockSize: 16}, model, llmdAgentSpeedup, llmdAgentRequests)
	client := bench.NewClient(f.px.URL())
	defer client.Close()
	start := time.Now()
	results, err := bench.Run(ctx, client, wl, bench.RunOptions{Arrival: bench.Arrival{Kind: bench.ArrivalTrace}})
	if err != nil {
		b.Fatal(err)
	}
	m := bench.Measure(results, time.Since(start))
	if m.Errors > 0 {
		b.Logf("%s: %d errors, first: %s", mode, m.Errors, m.FirstError)
	}
	return m
}
