package scoring

import (
	"strconv"
	"strings"
)

// Explanation records why a decision went the way it did: every
// candidate's terms. String renders the seeds' log lines; it marshals to
// JSON for the explain endpoint. Pass one to Scheduler.Pick or Scheduler.Route
// only when it will be used: filling it costs allocations the fast path
// avoids. An Explanation may be reused; each pick overwrites it.
type Explanation struct {
	// RequestID is the request's ID.
	RequestID string `json:"request_id,omitempty"`
	// Mode is the router mode that decided.
	Mode string `json:"mode"`
	// CostModel is CostDefault or CostWeighted for the kv modes.
	CostModel string `json:"cost_model,omitempty"`
	// Coefficients are the weighted cost model's a, b and c.
	Coefficients *WeightedCoefficients `json:"coefficients,omitempty"`
	// OverlapCredit and PrefillLoadScale are the default cost's knobs.
	OverlapCredit    float64 `json:"overlap_credit,omitempty"`
	PrefillLoadScale float64 `json:"prefill_load_scale,omitempty"`
	// Temperature is the selection temperature of the kv modes.
	Temperature float64 `json:"temperature"`
	// PromptTokens is the request's prompt length.
	PromptTokens int `json:"prompt_tokens"`
	// Chosen is the chosen worker's ID.
	Chosen string `json:"chosen"`
	// Workers holds every candidate's terms in candidate order.
	Workers []Terms `json:"workers"`
}

// WeightedCoefficients are the weighted cost model's a, b and c.
type WeightedCoefficients struct {
	A float64 `json:"a"`
	B float64 `json:"b"`
	C float64 `json:"c"`
}

// Terms are one candidate's inputs and cost in a decision.
type Terms struct {
	Worker string `json:"worker"`
	// Logit is the cost the selection used, lower is better (the weighted
	// cost model's −Score).
	Logit float64 `json:"logit"`
	// PrefillLoadScale, PrefillBlocks and DecodeBlocks are the default
	// cost's terms: Logit = PrefillLoadScale × PrefillBlocks + DecodeBlocks,
	// PrefillBlocks already credited for the cache.
	PrefillLoadScale float64 `json:"prefill_load_scale,omitempty"`
	PrefillBlocks    float64 `json:"prefill_blocks,omitempty"`
	DecodeBlocks     float64 `json:"decode_blocks,omitempty"`
	// PredictedTTFT, DecodeSlowdown, MemoryPenalty, DuplicatePrefill and
	// CacheChurn are the latency cost's terms in seconds: Logit is their
	// sum.
	// ContextSeconds is the part of PredictedTTFT spent attending to
	// context: the cached prefix, and the backlog's own. DecodeKVSeconds
	// is the part spent in the decode steps of the worker's running
	// requests that share the prefill's passes (Options.DecodeKVCost).
	PredictedTTFT    float64 `json:"predicted_ttft_seconds,omitempty"`
	ContextSeconds   float64 `json:"context_seconds,omitempty"`
	DecodeKVSeconds  float64 `json:"decode_kv_seconds,omitempty"`
	DecodeSlowdown   float64 `json:"decode_slowdown_seconds,omitempty"`
	MemoryPenalty    float64 `json:"memory_penalty_seconds,omitempty"`
	DuplicatePrefill float64 `json:"duplicate_prefill_seconds,omitempty"`
	// CacheChurn is the latency cost's charge for evicting from a cache
	// that turned over lately (Options.CacheChurnWeight).
	CacheChurn float64 `json:"cache_churn_seconds,omitempty"`
	// Score, OverlapRatio, KVUsage and NormalizedWaiting are the weighted
	// cost's terms: Score = a·OverlapRatio − b·KVUsage − c·NormalizedWaiting.
	Score             float64 `json:"score,omitempty"`
	OverlapRatio      float64 `json:"overlap_ratio,omitempty"`
	KVUsage           float64 `json:"kv_usage,omitempty"`
	NormalizedWaiting float64 `json:"normalized_waiting,omitempty"`
	// Probability is the chance the worker had of being chosen, for
	// sampling modes (temperature > 0, weighted).
	Probability float64 `json:"probability,omitempty"`
	// The load and overlap the terms came from. MatchedBlocks are the
	// leading blocks the KV index holds for the worker; PendingBlocks the
	// blocks after them that the router sent the worker recently and its
	// KV events have not confirmed yet (the pending overlay). The cost
	// credits both.
	MatchedBlocks int `json:"matched_blocks"`
	PendingBlocks int `json:"pending_blocks,omitempty"`
	CachedBlocks  int `json:"cached_blocks"`
	// ForecastLostBlocks were matched too, and are not counted: the
	// allocations queued ahead on the worker would evict them before the
	// request runs (the eviction forecast).
	ForecastLostBlocks int     `json:"forecast_lost_blocks,omitempty"`
	ActiveBlocks       int     `json:"active_blocks"`
	ActiveRequests     int     `json:"active_requests"`
	PrefillTokens      int     `json:"prefill_tokens"`
	Weight             float64 `json:"weight"`
	// The worker's modelled prefill backlog (tokens) and learned prefill
	// model: rate in tokens/s, overhead in seconds.
	PrefillBacklog  float64 `json:"prefill_backlog"`
	PrefillRate     float64 `json:"prefill_rate"`
	PrefillOverhead float64 `json:"prefill_overhead_seconds"`
	// PrefillContext is the learned cost of one token attending to one
	// other (seconds), and PrefillBacklogAttention the backlog's
	// attention work in token pairs.
	PrefillContext          float64 `json:"prefill_context_seconds,omitempty"`
	PrefillBacklogAttention float64 `json:"prefill_backlog_attention,omitempty"`
	// PrefillPass is the learned extra cost of a prefill pass shared
	// with other active requests (seconds).
	PrefillPass float64 `json:"prefill_pass_seconds,omitempty"`
	HostBlocks  int     `json:"host_blocks,omitempty"`
	DiskBlocks  int     `json:"disk_blocks,omitempty"`
}

func termsFromLoad(l *Load) Terms {
	return Terms{
		Worker: l.ID, MatchedBlocks: l.MatchedBlocks - l.PendingBlocks, PendingBlocks: l.PendingBlocks, CachedBlocks: l.CachedBlocks, ForecastLostBlocks: l.ForecastLostBlocks,
		ActiveBlocks: l.ActiveBlocks, ActiveRequests: l.ActiveRequests,
		PrefillTokens: l.PrefillTokens, Weight: l.Weight,
		PrefillBacklog: l.PrefillBacklog, PrefillRate: l.PrefillRate, PrefillOverhead: l.PrefillOverhead,
		PrefillContext: l.PrefillContext, PrefillBacklogAttention: l.PrefillBacklogAttention, PrefillPass: l.PrefillPass,
		HostBlocks: l.HostBlocks, DiskBlocks: l.DiskBlocks,
	}
}

func (e *Explanation) begin(mode string, req *Request, temperature float64, chosen string) {
	*e = Explanation{
		RequestID: req.ID, Mode: mode, Temperature: temperature,
		PromptTokens: req.PromptTokens, Chosen: chosen, Workers: e.Workers[:0],
	}
}

// Line renders worker i's terms as one log line, in the seeds' format for
// the default cost:
//
//	worker=w1 logit=125.3 = 1.0*100.5 + 25.0 (cached_blocks=15)
func (e *Explanation) Line(i int) string {
	t := &e.Workers[i]
	var b strings.Builder
	b.WriteString("worker=")
	b.WriteString(t.Worker)
	switch {
	case e.CostModel == CostDefault:
		b.WriteString(" logit=" + f1(t.Logit) + " = " + f1(t.PrefillLoadScale) + "*" + f1(t.PrefillBlocks) + " + " + f1(t.DecodeBlocks))
	case e.CostModel == CostLatency:
		b.WriteString(" logit=" + f3(t.Logit) + "s = ttft " + f3(t.PredictedTTFT) + " (context " + f3(t.ContextSeconds) + ", decode kv " + f3(t.DecodeKVSeconds) + ") + slowdown " + f3(t.DecodeSlowdown) +
			" + memory " + f3(t.MemoryPenalty) + " + duplicate " + f3(t.DuplicatePrefill) + " + churn " + f3(t.CacheChurn) + " (rate=" + strconv.FormatFloat(t.PrefillRate, 'f', 0, 64) +
			" tok/s overhead=" + f3(t.PrefillOverhead) + "s backlog=" + strconv.FormatFloat(t.PrefillBacklog, 'f', 0, 64) + ")")
	case e.CostModel == CostWeighted && e.Coefficients != nil:
		c := e.Coefficients
		b.WriteString(" score=" + f3(t.Score) + " = " + f1(c.A) + "*" + f3(t.OverlapRatio) +
			" - " + f1(c.B) + "*" + f3(t.KVUsage) + " - " + f1(c.C) + "*" + f3(t.NormalizedWaiting))
	default:
		b.WriteString(" active_blocks=" + strconv.Itoa(t.ActiveBlocks) +
			" active_requests=" + strconv.Itoa(t.ActiveRequests) +
			" prefill_tokens=" + strconv.Itoa(t.PrefillTokens) + " weight=" + f1(t.Weight))
	}
	if t.Probability > 0 {
		b.WriteString(" p=" + f3(t.Probability))
	}
	b.WriteString(" (cached_blocks=" + strconv.Itoa(t.CachedBlocks))
	if t.PendingBlocks > 0 {
		b.WriteString(" matched_blocks=" + strconv.Itoa(t.MatchedBlocks) + " pending_blocks=" + strconv.Itoa(t.PendingBlocks))
	}
	b.WriteString(")")
	return b.String()
}

// String renders one line per candidate followed by the chosen worker.
func (e *Explanation) String() string {
	var b strings.Builder
	for i := range e.Workers {
		b.WriteString(e.Line(i))
		b.WriteByte('\n')
	}
	b.WriteString("chosen=" + e.Chosen + " mode=" + e.Mode)
	if e.CostModel != "" {
		b.WriteString(" cost_model=" + e.CostModel + " temperature=" + strconv.FormatFloat(e.Temperature, 'g', -1, 64))
	}
	return b.String()
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f3(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
