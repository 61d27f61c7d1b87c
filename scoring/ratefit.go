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
	s0, sx, sy, sxx, sxy float64
	samples              int
	// rate (tokens/s) and overhead (s) are the current estimates.
	rate, overhead float64
}

// Fitting constants: each sample's weight decays by fitDecay per later
// sample (a memory of about 500 requests); the prior counts as
// priorWeight samples spread over [0, priorSpan] tokens.
const (
	fitDecay    = 0.998
	priorWeight = 8
	priorSpan   = 16384
)

func newRateFit(rate float64, overhead time.Duration) rateFit {
	f := rateFit{rate: rate, overhead: overhead.Seconds()}
	// Prior pseudo-samples at both ends of the span pin slope and intercept.
	for _, x := range []float64{0, priorSpan} {
		w := priorWeight / 2.0
		y := f.overhead + x/rate
		f.s0 += w
		f.sx += w * x
		f.sy += w * y
		f.sxx += w * x * x
		f.sxy += w * x * y
	}
	return f
}

// add learns one observation and refreshes the estimates, keeping the rate
// within a factor of 20 of the prior (a sample can be wild: a request
// stuck behind a preemption).
func (f *rateFit) add(x, y float64, prior float64) {
	if !(x >= 0) || !(y > 0) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return
	}
	f.s0 = f.s0*fitDecay + 1
	f.sx = f.sx*fitDecay + x
	f.sy = f.sy*fitDecay + y
	f.sxx = f.sxx*fitDecay + x*x
	f.sxy = f.sxy*fitDecay + x*y
	f.samples++
	det := f.s0*f.sxx - f.sx*f.sx
	if det <= 0 {
		return
	}
	slope := (f.s0*f.sxy - f.sx*f.sy) / det
	if !(slope > 0) {
		return
	}
	rate := math.Min(math.Max(1/slope, prior/20), prior*20)
	f.rate = rate
	f.overhead = math.Max((f.sy-f.sx/rate)/f.s0, 0)
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
