package picker

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/scoring"
)

// BenchmarkFallbacks measures naming the runner-ups after a pick: the cost
// the retry list adds to every decision.
func BenchmarkFallbacks(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			pl := &plan{}
			exp := &scoring.Explanation{}
			for i := range n {
				id := fmt.Sprintf("w%d", i)
				pl.cands = append(pl.cands, scoring.Candidate{Worker: id})
				pl.addrs = append(pl.addrs, fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256))
				exp.Workers = append(exp.Workers, scoring.Terms{Worker: id, Logit: float64((i * 7919) % n)})
			}
			d := scoring.Decision{Worker: "w3", Index: 3, Address: pl.addrs[3]}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if got := pl.fallbacks(exp, d, 2); len(got) != 2 {
					b.Fatalf("fallbacks %v", got)
				}
			}
		})
	}
}

// The partial selection names the same workers, in the same order, as a
// stable sort of the explanation by logit would.
func TestFallbacksMatchAFullSort(t *testing.T) {
	for _, n := range []int{1, 2, 3, 6} {
		pl := &plan{}
		exp := &scoring.Explanation{}
		for i := range 40 {
			id := fmt.Sprintf("w%d", i)
			pl.cands = append(pl.cands, scoring.Candidate{Worker: id})
			pl.addrs = append(pl.addrs, fmt.Sprintf("10.0.0.%d:8000", i))
			exp.Workers = append(exp.Workers, scoring.Terms{Worker: id, Logit: float64((i * 7) % 5)}) // many ties
		}
		d := scoring.Decision{Worker: "w5", Index: 5, Address: pl.addrs[5]}
		var want []string
		for l := 0.0; l < 5 && len(want) < n; l++ {
			for i, w := range exp.Workers {
				if w.Logit == l && w.Worker != d.Worker && len(want) < n {
					want = append(want, pl.addrs[i])
				}
			}
		}
		if got := pl.fallbacks(exp, d, n); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("n=%d: fallbacks %v, want %v", n, got, want)
		}
	}
}
