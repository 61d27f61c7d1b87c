package scoring

import (
	"math"
	"slices"
	"time"
)

// rateFit learns one worker's prefill speed online from what the router
// sees on the response path. For each request it takes the prefill work
// ahead of it at dispatch plus its own, as tokens (x) and as attention
// over context (z, token², see attentionWork), the engine passes that
// work took while other requests ran beside it (d, see sharedPasses),
// and the time to its first response byte (y, seconds), and fits
//
//	y = overhead + x ÷ rate + context × z + pass × d
//
// by exponentially weighted least squares, so the fit follows a worker
// whose speed changes. It starts from the prior as if it had seen
// priorWeight samples on the prior's plane. A GPU spends time on every
// cached token a new token attends to, so the context term is what lets
// the router tell a prompt over a long cached history from the same
// prompt alone. The pass term is what a prefill pass costs more for
// sharing the engine with running requests, beyond the KV they read
// (Options.DecodeKVCost): nothing on an engine that runs a step's decodes
// inside the prefill's launch, a whole decode step on one that adds the
// two. Its prior is 0; it is learned once enough passes were shared.
// Guarded by Pool.mu.
type rateFit struct {
	// rate (tokens/s), overhead (s), context (s per token²) and pass (s
	// per shared pass) are the current estimates, first: every decision
	// reads them.
	rate, overhead, context, pass float64
	samples                       int
	// m and b are the exponentially weighted normal equations of the
	// observations over the features (1, x, z in units of zScale, d): m
	// holds the sums of their products, b the sums of each times y.
	m [fitTerms][fitTerms]float64
	b [fitTerms]float64
	// shared is the weighted count of the observations with shared
	// passes (d > 0), m[0][0] that of all of them.
	shared float64
	// The prior's plane, which fades as samples arrive.
	priorRate, priorOverhead, priorContext float64
}

// fitTerms is the number of features of a rateFit: the intercept, tokens,
// attention and shared passes.
const fitTerms = 4

// Fitting constants: each sample's weight decays by fitDecay per later
// sample (a memory of about 500 requests). The prior counts as
// priorWeight samples spread over [0, priorSpan] tokens and fades faster,
// by priorDecay per sample, so that it steadies the first few fits
// without biasing later ones. The pass term is fitted once the shared
// passes' weighted squares reach minPassSquares (a few dozen long
// prefills beside running requests); until then it stays 0.
const (
	fitDecay       = 0.998
	priorWeight    = 8
	priorDecay     = 0.95
	priorSpan      = 16384
	minPassSquares = 64
	// minShare is the share of the observations, shared and alone, that
	// the pass term needs of each.
	minShare = 0.1
	// maxPass bounds the pass term: a decode step of a large batch.
	maxPass = 0.1
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

// sharedPasses is the engine passes a prefill of tokens (its own and the
// backlog ahead of it) takes, at maxBatched tokens a pass, when other
// requests are active on the worker (others > 0): each of those passes
// also runs them. Requests that arrive later wait for the prefill ahead,
// so those present at dispatch are the ones that share its passes.
func sharedPasses(tokens float64, others, maxBatched int) float64 {
	if others <= 0 || !(tokens > 0) {
		return 0
	}
	if maxBatched <= 0 {
		maxBatched = DefaultMaxNumBatchedTokens
	}
	return math.Ceil(tokens / float64(maxBatched))
}

func newRateFit(rate float64, overhead time.Duration, context float64) rateFit {
	return rateFit{priorRate: rate, priorOverhead: overhead.Seconds(), priorContext: context,
		rate: rate, overhead: overhead.Seconds(), context: context}
}

// add learns one observation and refreshes the estimates, keeping the rate
// within a factor of 20 of the prior, the context cost within 0 and 20
// times the prior and the pass cost within 0 and maxPass (a sample can be
// wild: a request stuck behind a preemption). With a prior context cost
// of 0 the context term stays off.
func (f *rateFit) add(x, z, d, y float64) {
	if !(x >= 0) || !(z >= 0) || !(d >= 0) || !(y > 0) || math.IsInf(x, 0) || math.IsInf(z, 0) || math.IsInf(d, 0) || math.IsInf(y, 0) {
		return
	}
	v := [fitTerms]float64{1, x, z / zScale, d}
	for i := range v {
		for j := range v {
			f.m[i][j] = f.m[i][j]*fitDecay + v[i]*v[j]
		}
		f.b[i] = f.b[i]*fitDecay + v[i]*y
	}
	f.shared *= fitDecay
	if d > 0 {
		f.shared++
	}
	f.samples++
	m, b := f.m, f.b
	// The prior's pseudo-samples pin what the observations cannot: a
	// request of no tokens, and one of priorSpan tokens cold and over as
	// much cached context, none of them sharing a pass.
	w := priorWeight / 3 * math.Pow(priorDecay, float64(f.samples))
	ctx := f.priorContext * zScale
	for _, p := range [][2]float64{{0, 0}, {priorSpan, attentionWork(priorSpan, 0) / zScale}, {priorSpan, attentionWork(priorSpan, priorSpan) / zScale}} {
		pv := [fitTerms]float64{1, p[0], p[1], 0}
		py := f.priorOverhead + p[0]/f.priorRate + ctx*p[1]
		for i := range pv {
			for j := range pv {
				m[i][j] += w * pv[i] * pv[j]
			}
			b[i] += w * pv[i] * py
		}
	}
	lo, hi := f.priorRate/20, f.priorRate*20
	// The pass term is told from the rest only by comparing passes shared
	// with passes alone: a worker that always has requests beside each
	// prefill (a saturated one) cannot separate it from its rate and
	// overhead, and a fit that tries follows its queueing noise.
	alone := f.m[0][0] - f.shared
	withPass := f.m[3][3] >= minPassSquares && f.shared >= minShare*f.m[0][0] && alone >= minShare*f.m[0][0]
	withContext := f.priorContext > 0
	// The richest model whose solution makes sense: with the context and
	// pass terms where they are on, then without the pass term, then a
	// line in x alone.
	for _, terms := range [][]int{{0, 1, 2, 3}, {0, 1, 2}, {0, 1, 3}, {0, 1}} {
		if (slices.Contains(terms, 2) && !withContext) || (slices.Contains(terms, 3) && !withPass) {
			continue
		}
		c, ok := solveNormal(&m, &b, terms)
		if !ok || !(c[1] > 0) || c[2] < 0 || c[3] < 0 {
			continue
		}
		f.rate = math.Min(math.Max(1/c[1], lo), hi)
		f.context = math.Min(c[2]/zScale, f.priorContext*20)
		f.pass = math.Min(c[3], maxPass)
		f.overhead = math.Max(c[0], 0)
		return
	}
}

// solveNormal solves the normal equations m·c = b restricted to the
// features in terms, by Gaussian elimination with partial pivoting; the
// other coefficients are 0.
func solveNormal(m *[fitTerms][fitTerms]float64, b *[fitTerms]float64, terms []int) (c [fitTerms]float64, ok bool) {
	n := len(terms)
	var a [fitTerms][fitTerms + 1]float64
	for i, ti := range terms {
		for j, tj := range terms {
			a[i][j] = m[ti][tj]
		}
		a[i][n] = b[ti]
	}
	for col := range n {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if !(math.Abs(a[piv][col]) > 0) || math.IsInf(a[piv][col], 0) {
			return c, false
		}
		a[col], a[piv] = a[piv], a[col]
		for r := col + 1; r < n; r++ {
			k := a[r][col] / a[col][col]
			for j := col; j <= n; j++ {
				a[r][j] -= k * a[col][j]
			}
		}
	}
	var sol [fitTerms]float64
	for i := n - 1; i >= 0; i-- {
		v := a[i][n]
		for j := i + 1; j < n; j++ {
			v -= a[i][j] * sol[j]
		}
		sol[i] = v / a[i][i]
		if math.IsNaN(sol[i]) || math.IsInf(sol[i], 0) {
			return c, false
		}
	}
	for i, ti := range terms {
		c[ti] = sol[i]
	}
	return c, true
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
	// PassSeconds is what a prefill pass costs more, in seconds, when
	// other requests run beside it.
	PassSeconds float64 `json:"shared_pass_seconds"`
	// Samples counts the observations learned from.
	Samples int `json:"samples"`
}
