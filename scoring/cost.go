package scoring

import "math"

// KV is the cache-aware mode: each candidate gets a logit from the cost
// model (lower is better) and the temperature picks among them. It serves
// both "kv" and "kv_without_events"; they differ only in where the
// caller's overlap comes from.
//
// The default cost, in KV blocks (Dynamo's current form; docs/architecture.md §3.7):
//
//	logit   = scale × max(prefill − credit, 0) + decode
//	prefill = (backlog + prompt tokens) ÷ block size
//	credit  = overlap_credit × device blocks matched
//	        + host_weight × host blocks + disk_weight × disk blocks
//	decode  = the worker's KV blocks in use (Load.KVUsedBlocks)
//	        + this request's blocks (prompt + expected output)
//	        + request_weight × active requests
//
// where backlog is the worker's modelled prefill work still ahead
// (Load.PrefillBacklog; left out with NoTrackPrefillTokens). With credit 1
// it is the old overlap_weight × (backlog + uncached) + decode, scale
// playing the weight.
//
// The latency cost, in seconds of predicted time to first token:
//
//	logit    = overhead + (backlog + uncached) ÷ rate
//	         + context × (backlog attention + uncached × (cached + uncached ÷ 2))
//	         + slowdown_weight × active requests × duplicated ÷ rate
//	         + request_weight × active requests × block size ÷ rate
//	         + the time to recompute what the request would preempt
//	         + duplicate_weight × (longest prefix another candidate holds
//	           − this one's) ÷ rate
//	         + churn_weight × uncached ÷ rate × churn ÷ the candidates' mean churn
//
// with the worker's learned prefill rate, overhead and context cost
// (Load.PrefillRate, Load.PrefillOverhead, Load.PrefillContext: seconds
// per token pair, what each new token spends attending to the cached
// prefix and the tokens before it), uncached = prompt tokens not held on the device
// (host and disk blocks count at 1 − their weight), and preemption
// charged when the request's blocks exceed the worker's free KV, and churn
// the uncached tokens the worker took lately (Load.Churn): sending what
// evicts where the cache turned over least keeps every worker's cache as
// long-lived as the fleet allows.
//
// The weighted cost, higher is better and used as −score:
//
//	score = a·overlap_ratio − b·kv_usage − c·normalized_waiting
//
// where overlap_ratio = matched tokens ÷ prompt tokens, kv_usage = KV blocks
// in use ÷ capacity and normalized_waiting = Load.Waiting ÷ the largest
// waiting count among the candidates.
type KV struct {
	name         string
	source       OverlapSource
	model        string
	credit       float64
	scale        float64
	hostW, diskW float64
	reqW         float64
	slowdown     float64
	duplicate    float64
	churn        float64
	trackPrefill bool
	a, b, c      float64
	temperature  float64
	rand         Rand
}

var _ Mode = (*KV)(nil)

func newKV(o Options, src OverlapSource) *KV {
	name := ModeKV
	if src == OverlapApprox {
		name = ModeKVWithoutEvents
	}
	return &KV{
		name: name, source: src, model: o.CostModel,
		credit: o.OverlapCredit, scale: o.PrefillLoadScale, hostW: o.HostCacheHitWeight, diskW: o.DiskCacheHitWeight,
		reqW: o.DecodeActiveRequestWeight, slowdown: o.DecodeSlowdownWeight, duplicate: o.DuplicatePrefillWeight, churn: o.CacheChurnWeight, trackPrefill: !o.NoTrackPrefillTokens,
		a: o.WeightedA, b: o.WeightedB, c: o.WeightedC,
		temperature: o.Temperature, rand: o.Rand,
	}
}

// Name implements Mode.
func (m *KV) Name() string { return m.name }

// Overlap implements Mode.
func (m *KV) Overlap() OverlapSource { return m.source }

// Pick implements Mode.
func (m *KV) Pick(req *Request, loads []Load, exp *Explanation) int {
	var maxWaiting int
	if m.model == CostWeighted {
		for i := range loads {
			maxWaiting = max(maxWaiting, loads[i].Waiting())
		}
	}
	var fleet fleetView
	if m.model == CostLatency {
		fleet = m.view(req, loads)
	}
	for i := range loads {
		switch m.model {
		case CostWeighted:
			loads[i].logit = -m.weightedTerms(req, &loads[i], maxWaiting).score
		case CostLatency:
			loads[i].logit = m.latencyTerms(req, &loads[i], fleet).logit
		default:
			loads[i].logit = m.defaultTerms(req, &loads[i]).logit
		}
	}
	idx := selectLogit(loads, m.temperature, m.rand)
	if exp != nil {
		m.explain(req, loads, idx, maxWaiting, fleet, exp)
	}
	return idx
}

type defaultTerms struct{ prefill, decode, logit float64 }

func (m *KV) defaultTerms(req *Request, l *Load) defaultTerms {
	bs := float64(l.BlockSize)
	raw := float64(req.PromptTokens)
	if m.trackPrefill {
		raw += l.PrefillBacklog
	}
	credit := m.credit*float64(l.MatchedBlocks) + m.hostW*float64(l.HostBlocks) + m.diskW*float64(l.DiskBlocks)
	prefill := max(raw/bs-credit, 0)
	decode := float64(l.KVUsedBlocks()+blocksFor(req.PromptTokens+req.ExpectedOutputTokens, l.BlockSize)) +
		m.reqW*float64(l.ActiveRequests)
	return defaultTerms{prefill: prefill, decode: decode, logit: m.scale*prefill + decode}
}

// latencyTerms are the latency cost's parts in seconds; ttft includes
// context, the part spent attending to context.
type latencyTerms struct{ ttft, context, slowdown, memory, duplicate, churn, logit float64 }

// maxHeldTokens is the longest prompt prefix, in tokens, that any candidate
// holds on its device or is computing (the pending overlay).
func maxHeldTokens(req *Request, loads []Load) int {
	n := 0
	for i := range loads {
		n = max(n, heldTokens(req, &loads[i]))
	}
	return n
}

// heldTokens is how much of the prompt, in tokens, l's worker holds on its
// device or is computing.
func heldTokens(req *Request, l *Load) int {
	return min(l.MatchedBlocks*l.BlockSize, req.PromptTokens)
}

// fleetView is what the latency cost compares each candidate against: the
// longest prefix (tokens) any candidate holds, for the duplicate-prefill
// term, and the candidates' mean churn, for the churn term.
type fleetView struct {
	held      int
	meanChurn float64
}

func (m *KV) view(req *Request, loads []Load) fleetView {
	var v fleetView
	if m.duplicate > 0 || m.slowdown > 0 {
		v.held = maxHeldTokens(req, loads)
	}
	if m.churn > 0 {
		for i := range loads {
			v.meanChurn += loads[i].Churn
		}
		v.meanChurn /= float64(len(loads))
	}
	return v
}

// latencyTerms predicts a candidate's cost against the fleet's view.
func (m *KV) latencyTerms(req *Request, l *Load, fleet fleetView) latencyTerms {
	bs := float64(l.BlockSize)
	rate := l.PrefillRate
	if !(rate > 0) {
		rate = DefaultPrefillRate
	}
	held := float64(l.MatchedBlocks) + m.hostW*float64(l.HostBlocks) + m.diskW*float64(l.DiskBlocks)
	uncached := max(float64(req.PromptTokens)-held*bs, 0)
	var t latencyTerms
	backlog, backlogAttn := 0.0, 0.0
	if m.trackPrefill {
		backlog, backlogAttn = l.PrefillBacklog, l.PrefillBacklogAttention
	}
	cached := float64(req.PromptTokens) - uncached
	t.context = l.PrefillContext * (backlogAttn + uncached*(cached+uncached/2))
	t.ttft = l.PrefillOverhead + (backlog+uncached)/rate + t.context
	// Recomputing blocks another candidate holds stalls every stream on
	// this worker for as long as it takes: under load that grows with the
	// streams, and it keeps sessions on their holders where a queue's
	// noise would otherwise scatter them. A prompt no one holds pays
	// nothing here, whatever the worker's streams.
	dup := float64(max(fleet.held-heldTokens(req, l), 0))
	t.slowdown = m.slowdown * float64(l.ActiveRequests) * dup / rate
	// Each active request costs its block-equivalents of prefill time: a
	// busy worker's decode steps are slower for every stream on it.
	t.slowdown += m.reqW * float64(l.ActiveRequests) * bs / rate
	capacity := l.KVTotalBlocks
	if l.ReportFresh && l.Report.KVTotalBlocks > 0 {
		capacity = l.Report.KVTotalBlocks
	}
	if capacity > 0 {
		need := blocksFor(req.PromptTokens+req.ExpectedOutputTokens, l.BlockSize) - l.MatchedBlocks
		if over := need - (capacity - l.KVUsedBlocks()); over > 0 {
			t.memory = float64(over) * bs / rate
		}
	}
	// Computing blocks another worker already has spends the fleet's
	// capacity twice; the holder wins until its queue costs more than that.
	if dup := fleet.held - heldTokens(req, l); dup > 0 {
		t.duplicate = m.duplicate * float64(dup) / rate
	}
	// Every uncached token a worker takes evicts one from its cache's
	// least recently used end; the more it took lately, relative to the
	// others, the younger that end, and the likelier a later prompt
	// wanted it. Only this request's own uncached tokens are charged, so
	// a prompt that hits its cache is not pushed off its holder.
	if fleet.meanChurn > 0 {
		t.churn = m.churn * uncached / rate * l.Churn / fleet.meanChurn
	}
	t.logit = t.ttft + t.slowdown + t.memory + t.duplicate + t.churn
	return t
}

type weightedTerms struct{ ratio, usage, waiting, score float64 }

func (m *KV) weightedTerms(req *Request, l *Load, maxWaiting int) weightedTerms {
	var t weightedTerms
	if req.PromptTokens > 0 {
		t.ratio = min(float64(l.MatchedBlocks*l.BlockSize)/float64(req.PromptTokens), 1)
	}
	capacity := l.KVTotalBlocks
	if l.ReportFresh && l.Report.KVTotalBlocks > 0 {
		capacity = l.Report.KVTotalBlocks
	}
	if capacity > 0 {
		t.usage = min(float64(l.KVUsedBlocks())/float64(capacity), 1)
	}
	if maxWaiting > 0 {
		t.waiting = float64(l.Waiting()) / float64(maxWaiting)
	}
	t.score = m.a*t.ratio - m.b*t.usage - m.c*t.waiting
	return t
}

// explain renders the decision; fleet is Pick's view of the candidates.
func (m *KV) explain(req *Request, loads []Load, idx, maxWaiting int, fleet fleetView, exp *Explanation) {
	exp.begin(m.name, req, m.temperature, loads[idx].ID)
	exp.CostModel = m.model
	switch m.model {
	case CostWeighted:
		exp.Coefficients = &WeightedCoefficients{A: m.a, B: m.b, C: m.c}
	case CostDefault:
		exp.OverlapCredit, exp.PrefillLoadScale = m.credit, m.scale
	}
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
		switch m.model {
		case CostWeighted:
			w := m.weightedTerms(req, l, maxWaiting)
			t.Score, t.OverlapRatio, t.KVUsage, t.NormalizedWaiting = w.score, w.ratio, w.usage, w.waiting
		case CostLatency:
			lt := m.latencyTerms(req, l, fleet)
			t.PredictedTTFT, t.ContextSeconds, t.DecodeSlowdown, t.MemoryPenalty, t.DuplicatePrefill, t.CacheChurn = lt.ttft, lt.context, lt.slowdown, lt.memory, lt.duplicate, lt.churn
		default:
			d := m.defaultTerms(req, l)
			t.PrefillLoadScale, t.PrefillBlocks, t.DecodeBlocks = m.scale, d.prefill, d.decode
		}
		if probs {
			t.Probability = softmaxWeight(l.logit, minL, rng, m.temperature) / sum
		}
		exp.Workers = append(exp.Workers, t)
	}
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
	best, ties := 0, 1
	bestLogit := loads[0].logit
	tol := tieTolerance(bestLogit)
	for i := 1; i < len(loads); i++ {
		l := &loads[i]
		switch d := l.logit - bestLogit; {
		case d > tol:
		case d < -tol || l.CachedBlocks < loads[best].CachedBlocks:
			best, ties = i, 1
			bestLogit, tol = l.logit, tieTolerance(l.logit)
		case l.CachedBlocks == loads[best].CachedBlocks:
			// Reservoir sampling keeps each tied worker equally likely
			// without a second pass.
			ties++
			if r.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
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
