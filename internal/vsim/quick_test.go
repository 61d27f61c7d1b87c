package vsim

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

func TestQuickScratch(t *testing.T) {
	if os.Getenv("SCRATCH") == "" {
		t.Skip()
	}
	w, _ := AgentWorkload(DefaultAgentOptions())
	loads := []float64{}
	for _, f := range strings.Split(os.Getenv("LOADS"), ",") {
		v, _ := strconv.ParseFloat(f, 64)
		loads = append(loads, v)
	}
	for _, load := range loads {
		for _, mode := range strings.Split(os.Getenv("MODES"), ",") {
			o := scoring.DefaultOptions()
			name := mode
			if m, c, ok := strings.Cut(mode, ":"); ok {
				mode = m
				o.CostModel = c
			}
			o.Mode = mode
			if v := os.Getenv("CREDIT"); v != "" {
				o.OverlapCredit, _ = strconv.ParseFloat(v, 64)
			}
			if v := os.Getenv("SLOW"); v != "" {
				o.DecodeSlowdownWeight, _ = strconv.ParseFloat(v, 64)
			}
			if v := os.Getenv("SCALE"); v != "" {
				o.PrefillLoadScale, _ = strconv.ParseFloat(v, 64)
			}
			start := time.Now()
			res, err := Run(w, DefaultFleet(), o, load, 1)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%-14s load %4g: hit %.3f ttft p50 %7.0f p90 %7.0f p99 %7.0f itl50 %5.1f err %d stick %.2f exact %.2f pre %d (%s)", name, load, res.HitRate, res.TTFT.P50, res.TTFT.P90, res.TTFT.P99, res.ITL.P50, res.Errors, res.Stickiness, res.OverlapExact, res.Preemptions, time.Since(start).Round(time.Millisecond))
			if len(res.Fits) > 0 && o.CostModel == "latency" {
				t.Logf("   fit %+v", res.Fits[0])
			}
		}
	}
}
