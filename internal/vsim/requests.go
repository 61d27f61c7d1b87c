package vsim

import (
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/scoring"
)

// RequestRecord is one request of a run that got its first token, for
// `kvbench sim --requests-out`: where it went, what it found cached, its
// time to first token, and that time's floor.
type RequestRecord struct {
	Mode string  `json:"mode"`
	Load float64 `json:"load"`
	// Request is the request's index in the workload's arrival order.
	Request int    `json:"request"`
	Worker  string `json:"worker"`
	// ArrivalMs is when it arrived, in simulated milliseconds from the
	// start of the run.
	ArrivalMs    float64 `json:"arrival_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	// CachedTokens is what its engine found cached; PredictedCachedTokens
	// what the router's index predicted on the chosen worker.
	CachedTokens          int     `json:"cached_tokens"`
	PredictedCachedTokens int     `json:"predicted_cached_tokens"`
	TTFTMs                float64 `json:"ttft_ms"`
	// FloorMs is the request's time to first token alone on an idle worker
	// with the cached tokens it got: its own prefill, in steps of at most
	// max_num_batched_tokens, priced by the run's timing. TTFTMs − FloorMs
	// is what queueing and sharing steps cost it; only more hits lower
	// FloorMs.
	FloorMs float64 `json:"ttft_floor_ms"`
}

// ExplainRecord is the router's explanation of one decision, for
// `kvbench sim --explain-requests`: every candidate's terms as
// `POST /debug/explain` shows them, at the simulated time it decided.
type ExplainRecord struct {
	Mode string  `json:"mode"`
	Load float64 `json:"load"`
	// Request is the request's index in the workload's arrival order.
	Request int `json:"request"`
	// AtMs is when the router decided, in simulated milliseconds from the
	// start of the run.
	AtMs        float64             `json:"at_ms"`
	Explanation scoring.Explanation `json:"explanation"`
}

// floorMillis is the time to first token of a prompt of prompt tokens,
// cached of them already held, alone on an idle engine of cfg under t: the
// engine computes at least the last prompt token, in chunks of at most
// cfg.MaxNumBatchedTokens, and samples the first token at the end of the
// last chunk.
func floorMillis(t sim.Timing, cfg sim.EngineConfig, prompt, cached int) float64 {
	uncached := max(prompt-cached, 1)
	done := prompt - uncached
	budget := cfg.MaxNumBatchedTokens
	if budget <= 0 {
		budget = uncached
	}
	total := cfg.NumGPUBlocks * cfg.BlockSize
	var ms float64
	for uncached > 0 {
		c := min(uncached, budget)
		res := sim.StepResult{Scheduled: 1, PrefillTokens: c, PrefillContext: done,
			PrefillAttention: float64(c) * (float64(done) + float64(c)/2)}
		ms += t.StepMillis(&res, total)
		done += c
		uncached -= c
	}
	return ms
}
