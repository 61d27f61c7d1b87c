package scoring

import (
	"math"
	"time"
)

// rateFit learns one worker's prefill speed online from what the router
// sees on the response path. For each request it takes the prefill work
// ahead of it at dispatch plus its own, as tokens (x) and as attention
// over context (z, token², see attentionWork), and the time to its first
// response byte (y, seconds), and fits
//
//	y = overhead + x ÷ rate + context × z
//
// by exponentially weighted least squares, so the fit follows a worker
// whose speed changes. It starts from the prior as if it had seen
// priorWeight samples on the prior's plane. A GPU spends time on every
// cached token a new token attends to, so the context term is what lets
// the router tell a prompt over a long cached history from the same
// prompt alone. Guarded by Pool.mu.
type rateFit struct {
	// rate (tokens/s), overhead (s) and context (s per token²) are the
	// current estimates, first: every decision reads them.
	rate, overhead, context float64
	samples                 int
	// Exponentially weighted sums of the observations: counts, first
	// and second moments of x, z (in units of zScale) and y.
	s0, sx, sz, sy, sxx, sxz, szz, sxy, szy float64
	// The prior's plane, which fades as samples arrive.
	priorRate, priorOverhead, priorContext float64
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
	// zScale keeps the attention sums near the token sums in magnitude,
	// for a well-conditioned solve.
	zScale = 1e6
)

// attentionWork is the attention a prefill of n new tokens over c cached
// ones computes, in token pairs: each new token attends to the c cached
// tokens and, on average, half of the other new ones.
func attentionWork(n, c int) float64 {
	if n <= 0 {
		return 0
	}
	return float64(n) * (float64(max(c, 0)) + float64(n)/2)
}

func newRateFit(rate float64, overhead time.Duration, context float64) rateFit {
	return rateFit{priorRate: rate, priorOverhead: overhead.Seconds(), priorContext: context,
		rate: rate, overhead: overhead.Seconds(), context: context}
}

// add learns one observation and refreshes the estimates, keeping the rate
// within a factor of 20 of the prior and the context cost within 0 and 20
// times the prior (a sample can be wild: a request stuck behind a
// preemption). With a prior context cost of 0 the context term stays off.
func (f *rateFit) add(x, z, y float64) {
	if !(x >= 0) || !(z >= 0) || !(y > 0) || math.IsInf(x, 0) || math.IsInf(z, 0) || math.IsInf(y, 0) {
		return
	}
	z /= zScale
	f.s0 = f.s0*fitDecay + 1
	f.sx = f.sx*fitDecay + x
	f.sz = f.sz*fitDecay + z
	f.sy = f.sy*fitDecay + y
	f.sxx = f.sxx*fitDecay + x*x
	f.sxz = f.sxz*fitDecay + x*z
	f.szz = f.szz*fitDecay + z*z
	f.sxy = f.sxy*fitDecay + x*y
	f.szy = f.szy*fitDecay + z*y
	f.samples++
	s := [9]float64{f.s0, f.sx, f.sz, f.sy, f.sxx, f.sxz, f.szz, f.sxy, f.szy}
	// The prior's pseudo-samples pin what the observations cannot: a
	// request of no tokens, and one of priorSpan tokens cold and over as
	// much cached context.
	w := priorWeight / 3 * math.Pow(priorDecay, float64(f.samples))
	ctx := f.priorContext * zScale
	for _, p := range [][2]float64{{0, 0}, {priorSpan, attentionWork(priorSpan, 0) / zScale}, {priorSpan, attentionWork(priorSpan, priorSpan) / zScale}} {
		px, pz := p[0], p[1]
		py := f.priorOverhead + px/f.priorRate + ctx*pz
		s[0] += w
		s[1] += w * px
		s[2] += w * pz
		s[3] += w * py
		s[4] += w * px * px
		s[5] += w * px * pz
		s[6] += w * pz * pz
		s[7] += w * px * py
		s[8] += w * pz * py
	}
	lo, hi := f.priorRate/20, f.priorRate*20
	if f.priorContext > 0 {
		if o, a, c, ok := solve3(s); ok && a > 0 && c >= 0 {
			f.rate = math.Min(math.Max(1/a, lo), hi)
			f.context = math.Min(c/zScale, f.priorContext*20)
			f.overhead = math.Max(o, 0)
			return
		}
	}
	// Without the context term, or when the plane has no sensible
	// solution: a line in x alone.
	det := s[0]*s[4] - s[1]*s[1]
	if det <= 0 {
		return
	}
	slope := (s[0]*s[7] - s[1]*s[3]) / det
	if !(slope > 0) {
		return
	}
	f.rate = math.Min(math.Max(1/slope, lo), hi)
	f.context = 0
	f.overhead = math.Max((s[3]-s[1]/f.rate)/s[0], 0)
}

// solve3 solves the normal equations of y = o + a·x + c·z from the sums
// s0, sx, sz, sy, sxx, sxz, szz, sxy, szy by Cramer's rule.
func solve3(s [9]float64) (o, a, c float64, ok bool) {
	s0, sx, sz, sy, sxx, sxz, szz, sxy, szy := s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]
	det3 := func(a11, a12, a13, a21, a22, a23, a31, a32, a33 float64) float64 {
		return a11*(a22*a33-a23*a32) - a12*(a21*a33-a23*a31) + a13*(a21*a32-a22*a31)
	}
	d := det3(s0, sx, sz, sx, sxx, sxz, sz, sxz, szz)
	if !(math.Abs(d) > 0) || math.IsInf(d, 0) {
		return 0, 0, 0, false
	}
	o = det3(sy, sx, sz, sxy, sxx, sxz, szy, sxz, szz) / d
	a = det3(s0, sy, sz, sx, sxy, sxz, sz, szy, szz) / d
	c = det3(s0, sx, sy, sx, sxx, sxy, sz, sxz, szy) / d
	return o, a, c, !math.IsNaN(o) && !math.IsNaN(a) && !math.IsNaN(c)
}

// RateFit is one worker's learned prefill model, for the debug endpoints
// and metrics: time to first token ≈ Overhead + tokens ÷ PrefillRate +
// ContextSeconds × attention (token pairs: new tokens × (cached + new ÷ 2)).
type RateFit struct {
	Worker string `json:"worker"`
	// PrefillRate is in tokens per second.
	PrefillRate float64 `json:"prefill_rate_tokens_per_second"`
	// OverheadSeconds is the fixed part of a time to first token.
	OverheadSeconds float64 `json:"overhead_seconds"`
	// ContextSeconds is the cost of one token attending to one other, in
	// seconds: what cached context adds to a prefill.
	ContextSeconds float64 `json:"context_seconds_per_token_pair"`
	// Samples counts the observations learned from.
	Samples int `json:"samples"`
}
