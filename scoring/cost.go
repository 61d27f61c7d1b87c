package scoring

import "math"

// KV is the cache-aware mode: each candidate gets a logit from the cost
// model (lower is better) and the temperature picks among them. It serves
// both "kv" and "kv_without_events"; they differ only in where the
// caller's overlap comes from. The cost models are dynamoCost
// (CostDefault, Dynamo's form in KV blocks), latencyCost (CostLatency,
// predicted seconds to first token) and weightedCost (CostWeighted, GIE's
// weighted scorers); each documents its formula.
type KV struct {
	name        string
	source      OverlapSource
	cost        costModel
	temperature float64
	rand        Rand
}

var _ Mode = (*KV)(nil)

// costModel prices every candidate of one request: it sets each Load's
// logit (lower is better) and, for an explanation, its own terms. Each
// model is its own type with only its own parameters.
type costModel interface {
	// name is the model's configuration name (CostDefault, CostLatency,
	// CostWeighted).
	name() string
	// view is what the model compares every candidate against, from the
	// candidates' aggregates.
	view(s fleetStats) fleetView
	// parts prices what of a candidate does not depend on the others,
	// and finish completes the logit (lower is better) against the view:
	// every pick prices in these two steps, so that decidePruned, which
	// takes them apart, prices exactly as the full decision does. The
	// logit never falls when the candidate's backlog grows. They keep no
	// state: picks run concurrently.
	parts(req *Request, l *Load, p *loadParts)
	finish(p *loadParts, v fleetView) float64
	// logit is finish(parts(req, l), v) in one call.
	logit(req *Request, l *Load, v fleetView) float64
	// explain records the model's parameters in exp and its terms for
	// loads[i] in terms[i].
	explain(req *Request, loads []Load, exp *Explanation, terms []Terms)
}

func newKV(o Options, src OverlapSource) *KV {
	name := ModeKV
	if src == OverlapApprox {
		name = ModeKVWithoutEvents
	}
	return &KV{name: name, source: src, cost: newCostModel(o), temperature: o.Temperature, rand: o.Rand}
}

// newCostModel returns the cost model o names, with o's parameters.
func newCostModel(o Options) costModel {
	switch o.CostModel {
	case CostWeighted:
		return &weightedCost{a: o.WeightedA, b: o.WeightedB, c: o.WeightedC}
	case CostLatency:
		return &latencyCost{hostW: o.HostCacheHitWeight, diskW: o.DiskCacheHitWeight,
			reqW: o.DecodeActiveRequestWeight, slowdown: o.DecodeSlowdownWeight, duplicate: o.DuplicatePrefillWeight,
			churn: o.CacheChurnWeight, decodeKV: o.DecodeKVCost, trackPrefill: !o.NoTrackPrefillTokens}
	default:
		return &dynamoCost{credit: o.OverlapCredit, scale: o.PrefillLoadScale, hostW: o.HostCacheHitWeight,
			diskW: o.DiskCacheHitWeight, reqW: o.DecodeActiveRequestWeight, trackPrefill: !o.NoTrackPrefillTokens}
	}
}

// Name implements Mode.
func (m *KV) Name() string { return m.name }

// Overlap implements Mode.
func (m *KV) Overlap() OverlapSource { return m.source }

// Pick implements Mode.
func (m *KV) Pick(req *Request, loads []Load, exp *Explanation) int {
	price(m.cost, req, loads)
	idx := selectLogit(loads, m.temperature, m.rand)
	if exp != nil {
		m.explain(req, loads, idx, exp)
	}
	return idx
}

// price sets every candidate's logit with c.
func price(c costModel, req *Request, loads []Load) {
	var s fleetStats
	for i := range loads {
		s.add(req, &loads[i])
	}
	v := c.view(s)
	for i := range loads {
		loads[i].logit = c.logit(req, &loads[i], v)
	}
}

// explain renders the decision.
func (m *KV) explain(req *Request, loads []Load, idx int, exp *Explanation) {
	exp.begin(m.name, req, m.temperature, loads[idx].ID)
	exp.CostModel = m.cost.name()
	probs := m.temperature > 0
	var minL, rng float64
	var sum float64
	if probs {
		minL, rng = logitRange(loads)
		for i := range loads {
			sum += softmaxWeight(loads[i].logit, minL, rng, m.temperature)
		}
	}
	for i := range loads {
		l := &loads[i]
		t := termsFromLoad(l)
		t.Logit = l.logit
		if probs {
			t.Probability = softmaxWeight(l.logit, minL, rng, m.temperature) / sum
		}
		exp.Workers = append(exp.Workers, t)
	}
	m.cost.explain(req, loads, exp, exp.Workers)
}

// tieEpsilon treats logits this close (relative) as equal, so float noise
// in sums does not decide ties.
const tieEpsilon = 1e-9

func tieTolerance(logit float64) float64 { return tieEpsilon * math.Max(1, math.Abs(logit)) }

// selectLogit picks by the loads' logits: at temperature 0 the lowest,
// ties to the fewest cached blocks, then uniformly at random; above 0 a
// sample from softmax(−(logit − min) ÷ (range × T)), uniform when every
// logit is equal.
func selectLogit(loads []Load, temperature float64, r Rand) int {
	if len(loads) == 1 {
		return 0
	}
	if temperature > 0 {
		return sampleSoftmax(loads, temperature, r)
	}
	var s lowest
	s.first(0, loads[0].logit, loads[0].CachedBlocks)
	for i := 1; i < len(loads); i++ {
		s.consider(i, loads[i].logit, loads[i].CachedBlocks, r)
	}
	return s.best
}

// lowest is selectLogit's scan at temperature 0, one candidate at a time:
// the lowest logit, ties (within tieTolerance of the best so far) to the
// fewest cached blocks, then uniformly at random.
type lowest struct {
	best, ties int
	logit, tol float64
	cached     int
}

// first starts the scan with candidate i.
func (s *lowest) first(i int, logit float64, cached int) {
	s.best, s.ties, s.logit, s.tol, s.cached = i, 1, logit, tieTolerance(logit), cached
}

// consider compares candidate i with the best so far.
func (s *lowest) consider(i int, logit float64, cached int, r Rand) {
	switch d := logit - s.logit; {
	case d > s.tol:
	case d < -s.tol || cached < s.cached:
		s.best, s.ties, s.cached = i, 1, cached
		s.logit, s.tol = logit, tieTolerance(logit)
	case cached == s.cached:
		// Reservoir sampling keeps each tied worker equally likely
		// without a second pass. The best's logit stays the first tied
		// one's, as its cached blocks are the same.
		s.ties++
		if r.IntN(s.ties) == 0 {
			s.best = i
		}
	}
}

func logitRange(loads []Load) (minL, rng float64) {
	minL, maxL := loads[0].logit, loads[0].logit
	for i := 1; i < len(loads); i++ {
		// The builtins compile to min/max instructions; math.Min/Max do not.
		minL = min(minL, loads[i].logit)
		maxL = max(maxL, loads[i].logit)
	}
	return minL, maxL - minL
}

// softmaxWeight is exp(−(logit − min) ÷ (range × T)); shifting by the
// minimum keeps every weight in (0, 1] without changing probabilities.
func softmaxWeight(logit, minL, rng, temperature float64) float64 {
	if rng == 0 {
		return 1
	}
	return math.Exp(-(logit - minL) / (rng * temperature))
}

func sampleSoftmax(loads []Load, temperature float64, r Rand) int {
	minL, rng := logitRange(loads)
	if rng == 0 {
		return r.IntN(len(loads))
	}
	var sum float64
	for i := range loads {
		loads[i].weight = softmaxWeight(loads[i].logit, minL, rng, temperature)
		sum += loads[i].weight
	}
	u := r.Float64() * sum
	for i := range loads {
		u -= loads[i].weight
		if u < 0 {
			return i
		}
	}
	return len(loads) - 1
}
