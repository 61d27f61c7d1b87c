package bench

import (
	"math"
	"testing"
)

func promptItem(p []int32) Item { return Item{Prompt: p, PromptLen: len(p)} }

func TestIdealHitRatesFollowVLLMsPrefixRules(t *testing.T) {
	blk := func(h int64) []int32 { return BlockTokens(nil, h, 16) }
	cat := func(parts ...[]int32) []int32 {
		var out []int32
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	a, b, c, d := blk(1), blk(2), blk(3), blk(4)
	for _, tc := range []struct {
		name         string
		prompts      [][]int32
		capacity     int
		inf, fleet   float64
		wantRequests int
	}{
		// The second identical prompt may reuse all but its last block:
		// one token is always recomputed.
		{"repeat", [][]int32{cat(a, b), cat(a, b)}, 100, 16.0 / 64, 16.0 / 64, 2},
		{"extension", [][]int32{cat(a, b), cat(a, b, c)}, 100, 32.0 / 80, 32.0 / 80, 2},
		{"different first block", [][]int32{cat(a, b), cat(c, b)}, 100, 0, 0, 2},
		// Two blocks of capacity: d pushes a out before it is needed again.
		{"evicted", [][]int32{cat(a, b, c), cat(d, d), cat(a, b, c)}, 2, 32.0 / 128, 0, 3},
		// Partial last block: never cached, still counted in the total.
		{"partial block", [][]int32{cat(a, b, c[:5]), cat(a, b, c[:5])}, 100, 32.0 / 74, 32.0 / 74, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Workload{}
			for _, p := range tc.prompts {
				w.Flows = append(w.Flows, Flow{Items: []Item{promptItem(p)}})
			}
			got, ok := IdealHitRates(w, 16, tc.capacity)
			if !ok {
				t.Fatal("no reference computed")
			}
			if math.Abs(got.Infinite-tc.inf) > 1e-9 || math.Abs(got.Fleet-tc.fleet) > 1e-9 || got.Requests != tc.wantRequests {
				t.Errorf("got infinite %.4f fleet %.4f over %d, want %.4f %.4f over %d",
					got.Infinite, got.Fleet, got.Requests, tc.inf, tc.fleet, tc.wantRequests)
			}
		})
	}
}

func TestIdealHitRatesNeedKnownPrompts(t *testing.T) {
	w := &Workload{Flows: []Flow{{Items: []Item{{Path: PathChat, Body: []byte(`{}`)}}}}}
	if _, ok := IdealHitRates(w, 16, 10); ok {
		t.Error("a reference was computed without any prompt")
	}
}

func TestSummarizeUsesNearestRank(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100..1, unsorted
	}
	s := Summarize(xs)
	if s.P50 != 50 || s.P90 != 90 || s.P99 != 99 || s.Mean != 50.5 {
		t.Errorf("got %+v, want p50 50 p90 90 p99 99 mean 50.5", s)
	}
	if (Summarize(nil) != Summary{}) {
		t.Error("no samples should give zeros")
	}
}
