package scoring

import (
	"math"
	"time"
)

// rateFit learns one worker's prefill speed online from what the router
// sees on the response path: for each request, the prefill work ahead of
// it at dispatch plus its own uncached tokens (x, tokens) and the time to
// its first response byte (y, seconds). It fits y = overhead + x ÷ rate by
// exponentially weighted least squares, so the fit follows a worker whose
// speed changes, and starts from the prior as if it had seen priorWeight
// samples on the prior's line. Guarded by Pool.mu.
type rateFit struct {
	// Exponentially weighted sums of the observations.
	s0, sx, sy, sxx, sxy float64
	samples              int
	// The prior's line, which fades as samples arrive.
	priorRate, priorOverhead float64
	// rate (tokens/s) and overhead (s) are the current estimates.
	rate, overhead float64
}

// Fitting constants: each sample's weight decays by fitDecay per later
// sample (a memory of about 500 requests). The prior counts as
// priorWeight samples spread over [0, priorSpan] tokens and fades faster,
// by priorDecay per sample, so that it steadies the first few fits
// without biasing later ones.
const (
	fitDecay    = 0.998
	priorWeight = 8
	priorDecay  = 0.95
	priorSpan   = 16384
)

func newRateFit(rate float64, overhead time.Duration) rateFit {
	return rateFit{priorRate: rate, priorOverhead: overhead.Seconds(), rate: rate, overhead: overhead.Seconds()}
}

// add learns one observation and refreshes the estimates, keeping the rate
// within a factor of 20 of the prior (a sample can be wild: a request
// stuck behind a preemption).
func (f *rateFit) add(x, y float64) {
	if !(x >= 0) || !(y > 0) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return
	}
	f.s0 = f.s0*fitDecay + 1
	f.sx = f.sx*fitDecay + x
	f.sy = f.sy*fitDecay + y
	f.sxx = f.sxx*fitDecay + x*x
	f.sxy = f.sxy*fitDecay + x*y
	f.samples++
	s0, sx, sy, sxx, sxy := f.s0, f.sx, f.sy, f.sxx, f.sxy
	// The prior's pseudo-samples at both ends of the span pin slope and
	// intercept while the observations cannot.
	w := priorWeight / 2 * math.Pow(priorDecay, float64(f.samples))
	for _, px := range []float64{0, priorSpan} {
		py := f.priorOverhead + px/f.priorRate
		s0 += w
		sx += w * px
		sy += w * py
		sxx += w * px * px
		sxy += w * px * py
	}
	det := s0*sxx - sx*sx
	if det <= 0 {
		return
	}
	slope := (s0*sxy - sx*sy) / det
	if !(slope > 0) {
		return
	}
	rate := math.Min(math.Max(1/slope, f.priorRate/20), f.priorRate*20)
	f.rate = rate
	f.overhead = math.Max((sy-sx/rate)/s0, 0)
}

// RateFit is one worker's learned prefill model, for the debug endpoints
// and metrics: time to first token ≈ Overhead + tokens ÷ PrefillRate.
type RateFit struct {
	Worker string `json:"worker"`
	// PrefillRate is in tokens per second.
	PrefillRate float64 `json:"prefill_rate_tokens_per_second"`
	// OverheadSeconds is the fixed part of a time to first token.
	OverheadSeconds float64 `json:"overhead_seconds"`
	// Samples counts the observations learned from.
	Samples int `json:"samples"`
}
