package vsim

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/scoring"
)

func conversation(b *testing.B) *Workload {
	b.Helper()
	recs, err := bench.NamedTrace("conversation")
	if err != nil {
		b.Fatal(err)
	}
	return TraceWorkload("conversation", recs, bench.DefaultTraceBlockSize)
}

// BenchmarkSweepConversation is the simulator's speed target: the whole
// 12,031-request conversation trace, 8 workers, kv / round_robin /
// least_loaded at loads 0.5–16, all CPUs. Target: ≤ 2 minutes on 2 cores.
func BenchmarkSweepConversation(b *testing.B) {
	w := conversation(b)
	opt := SweepOptions{Fleet: DefaultFleet(), Router: scoring.DefaultOptions(), Modes: []string{"kv", "round_robin", "least_loaded"},
		Loads: []float64{0.5, 1, 2, 4, 8, 16}, SLO: 2 * time.Second, Seed: 1}
	for b.Loop() {
		if _, err := Sweep(w, opt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunConversation is one run of the sweep: kv at load 1.
func BenchmarkRunConversation(b *testing.B) {
	w := conversation(b)
	o := scoring.DefaultOptions()
	var reqs int
	for b.Loop() {
		r, err := Run(w, DefaultFleet(), o, 1, 1)
		if err != nil {
			b.Fatal(err)
		}
		reqs += r.Requests
	}
	b.ReportMetric(float64(reqs)/b.Elapsed().Seconds(), "requests/s")
}
