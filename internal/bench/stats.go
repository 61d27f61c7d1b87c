package bench

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Summary is a latency distribution in milliseconds.
type Summary struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
}

// Summarize sorts xs in place and returns its percentiles (nearest rank)
// and mean; all zero for no samples.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Summary{P50: quantile(xs, 0.50), P90: quantile(xs, 0.90), P99: quantile(xs, 0.99), Mean: sum / float64(len(xs))}
}

// quantile is the nearest-rank quantile of sorted xs.
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// ModeResult is the measurement of one mode, in the JSON report's shape.
type ModeResult struct {
	Requests    int                `json:"requests"`
	Errors      int                `json:"errors"`
	HitRate     float64            `json:"hit_rate"`
	TTFT        Summary            `json:"ttft_ms"`
	ITL         Summary            `json:"itl_ms"`
	E2E         Summary            `json:"e2e_ms"`
	OutputTokS  float64            `json:"output_tok_s"`
	ReqS        float64            `json:"req_s"`
	WorkerShare map[string]float64 `json:"worker_share"`
	// Stickiness is the share of follow-up requests (Item.Follows) served
	// by the worker that served the request they follow, over FollowUps
	// such pairs that both succeeded; null when there were none.
	Stickiness *float64 `json:"stickiness"`
	FollowUps  int      `json:"follow_ups"`
	// OverlapExact is the share of requests whose router-predicted cached
	// tokens (x-kvroute-predicted-cached-tokens, echoed by kvsim) equal the
	// worker's usage.prompt_tokens_details.cached_tokens, over Predicted
	// requests that carried a prediction; null when none did (modes that
	// ignore the cache, or servers that do not echo it).
	OverlapExact *float64 `json:"overlap_exact"`
	Predicted    int      `json:"predicted"`
	// WallSeconds is how long the run took; FirstError one error text.
	WallSeconds float64 `json:"wall_s"`
	// Peaks are the simulated workers' worst engine states (A/B runs
	// against an Env only).
	Peaks map[string]WorkerPeak `json:"worker_peaks,omitempty"`
	// ClockLag is, per simulated worker, the seconds its loop fell behind
	// real time and skipped (sim.WorkerStats.ClockLag); LagWarning is set
	// when one of them exceeds 100 ms and 1 % of the wall time, which
	// means the host was too slow for the speedup and times are stretched.
	ClockLag   map[string]float64 `json:"clock_lag_s,omitempty"`
	LagWarning bool               `json:"clock_lag_warning,omitempty"`
	FirstError string             `json:"first_error,omitempty"`
	// TTFTSamples are the sorted TTFTs (ms) of successful requests, for
	// the chart; not written to JSON.
	TTFTSamples []float64 `json:"-"`
}

// Measure turns a run's results into a ModeResult; wall is the run's
// duration. Hit rate is Σ cached_tokens ÷ Σ prompt_tokens over successful
// requests; shares are fractions of successful requests.
func Measure(results []Result, wall time.Duration) ModeResult {
	m := ModeResult{Requests: len(results), WorkerShare: map[string]float64{}, WallSeconds: wall.Seconds()}
	var ttft, e2e, itl []float64
	var prompt, cached, out, ok int
	for i := range results {
		r := &results[i]
		if r.Err != nil {
			m.Errors++
			if m.FirstError == "" {
				m.FirstError = r.Err.Error()
			}
			continue
		}
		ok++
		ttft = append(ttft, ms(r.TTFT))
		e2e = append(e2e, ms(r.E2E))
		for _, g := range r.ITL {
			itl = append(itl, float64(g))
		}
		prompt += r.PromptTokens
		cached += r.CachedTokens
		out += r.OutputTokens
		w := r.Worker
		if w == "" {
			w = "unknown"
		}
		m.WorkerShare[w]++
	}
	for w := range m.WorkerShare {
		m.WorkerShare[w] /= float64(ok)
	}
	if prompt > 0 {
		m.HitRate = float64(cached) / float64(prompt)
	}
	m.Stickiness, m.FollowUps = stickiness(results)
	m.OverlapExact, m.Predicted = overlapExact(results)
	m.TTFT, m.E2E, m.ITL = Summarize(ttft), Summarize(e2e), Summarize(itl)
	m.TTFTSamples = ttft
	if s := wall.Seconds(); s > 0 {
		m.OutputTokS = float64(out) / s
		m.ReqS = float64(ok) / s
	}
	return m
}

// stickiness is the share of successful follow-ups served by the worker
// that served the (successful) request they follow, and their number.
func stickiness(results []Result) (*float64, int) {
	served := make(map[ItemRef]string, len(results))
	for i := range results {
		if r := &results[i]; r.Err == nil && r.Worker != "" {
			served[r.Ref] = r.Worker
		}
	}
	n, same := 0, 0
	for i := range results {
		r := &results[i]
		if r.Err != nil || r.Worker == "" || r.Follows == nil {
			continue
		}
		prev, ok := served[*r.Follows]
		if !ok {
			continue
		}
		n++
		if prev == r.Worker {
			same++
		}
	}
	return share(same, n), n
}

// overlapExact is the share of successful requests with a prediction whose
// predicted cached tokens equal the worker's, and their number.
func overlapExact(results []Result) (*float64, int) {
	n, exact := 0, 0
	for i := range results {
		r := &results[i]
		if r.Err != nil || r.PredictedCached == nil {
			continue
		}
		n++
		if *r.PredictedCached == r.CachedTokens {
			exact++
		}
	}
	return share(exact, n), n
}

// share is k/n, nil for n = 0.
func share(k, n int) *float64 {
	if n == 0 {
		return nil
	}
	v := float64(k) / float64(n)
	return &v
}

// SetClockLag records the workers' clock lag over a run of length wall.
func (m *ModeResult) SetClockLag(lag map[string]time.Duration, wall time.Duration) {
	m.ClockLag = make(map[string]float64, len(lag))
	for id, d := range lag {
		m.ClockLag[id] = d.Seconds()
		if LagExceeds(d, wall) {
			m.LagWarning = true
		}
	}
}

// WorstLag returns the worker with the most clock lag and its seconds.
func (m *ModeResult) WorstLag() (string, float64) {
	worst, secs := "", 0.0
	for _, id := range sortedKeys(m.ClockLag) {
		if m.ClockLag[id] > secs {
			worst, secs = id, m.ClockLag[id]
		}
	}
	return worst, secs
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
