package scoring

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Cost model names for Options.CostModel.
const (
	// CostDefault is the seeds' cost: logit = overlap_weight ×
	// prefill_blocks + decode_blocks, lower is better.
	CostDefault = "default"
	// CostWeighted is the weighted cost: a·overlap_ratio − b·kv_usage −
	// c·normalized_waiting, higher is better.
	CostWeighted = "weighted"
	// CostLatency predicts each candidate's time to first token in
	// seconds from its learned prefill rate, plus the delay the request
	// imposes on the worker's running decodes.
	CostLatency = "latency"
)

// CostModels lists the valid --cost-model names.
func CostModels() []string { return []string{CostDefault, CostWeighted, CostLatency} }

// Options configures a Pool and a Scheduler. Start from DefaultOptions: the
// zero Options is not the defaults (an overlap weight of 0 is a legitimate
// choice that means "ignore the cache"). Zero durations, an empty Mode,
// CostModel or QueuePolicy, and nil Now, Rand and Metrics do fall back to
// their defaults.
type Options struct {
	// Mode is the router mode (see ModeNames); default "kv".
	Mode string
	// CostModel is CostLatency, CostDefault or CostWeighted; default
	// CostLatency (chosen by kvbench sim sweeps: docs/routing.md).
	CostModel string
	// OverlapCredit is how many prefill blocks one device-cached block
	// takes off the default cost; above 1 it also discounts the worker's
	// backlog, favouring the cache more strongly. Default 1.
	OverlapCredit float64
	// PrefillLoadScale multiplies the (credited) prefill blocks against the
	// decode blocks in the default cost; 0 ignores prefill. Default 1.
	PrefillLoadScale float64
	// OverlapWeight is the deprecated --kv-overlap-score-weight: when
	// positive it sets PrefillLoadScale to its value and OverlapCredit to 1,
	// which gives the old cost weight × (backlog + uncached) + decode.
	OverlapWeight float64
	// HostCacheHitWeight and DiskCacheHitWeight credit blocks held in host
	// memory and on disk, as fractions of a device block. Defaults 0.75
	// and 0.25.
	HostCacheHitWeight, DiskCacheHitWeight float64
	// DecodeActiveRequestWeight charges this many block-equivalents per
	// request active on the worker: blocks in the default cost, their
	// prefill time in the latency cost. It spreads floods whose cached
	// prefix is short. Default 8.
	DecodeActiveRequestWeight float64
	// NoPrefillDecay charges a request's prefill whole until its first
	// token instead of draining the backlog at the learned prefill rate.
	NoPrefillDecay bool
	// PrefillRate (tokens/s) and PrefillOverhead are the prior of every
	// worker's prefill model: time to first token ≈ overhead + tokens ÷
	// rate. Defaults 20,000 tokens/s and 25 ms.
	PrefillRate     float64
	PrefillOverhead time.Duration
	// PrefillContextCost is the prior of the prefill model's context
	// term, in seconds per token pair: what one new token attending to
	// one cached (or earlier new) token costs, so that a prompt over a
	// long cached history, or a queue of them, is charged what the GPU
	// spends on it. 0 turns the term off. Default
	// DefaultPrefillContextCost.
	PrefillContextCost float64
	// DecodeKVCost is what one engine pass spends reading one KV token of
	// the requests active on the worker, in seconds: every pass a prefill
	// takes until its first token also runs the decode step of every
	// running request, which reads that request's whole KV cache. A
	// prompt that needs many passes (its uncached tokens and the backlog
	// ahead of it over max_num_batched_tokens) therefore waits longer on
	// a worker whose cache holds much running context, whatever its
	// queue. 0 turns the term off. Default DefaultDecodeKVCost.
	DecodeKVCost float64
	// NoLearnRates keeps the prior instead of learning each worker's
	// prefill model from its times to first token.
	NoLearnRates bool
	// NoEvictionForecast turns the eviction forecast off: a matched
	// prefix counts as cached even where the allocations queued ahead on
	// the worker would evict it before the request runs (forecast.go).
	NoEvictionForecast bool
	// DecodeSlowdownWeight weighs, in the latency cost, the seconds a
	// candidate would spend recomputing prompt blocks that another
	// candidate holds, once per request active on it: every stream on a
	// busy worker waits while it recomputes what it could have been
	// spared. It keeps sessions on their holders under overload, and
	// charges nothing for a prompt no worker holds. Default 0.25.
	DecodeSlowdownWeight float64
	// DuplicatePrefillWeight weighs, in the latency cost, the seconds a
	// candidate would spend computing prompt blocks that another worker
	// already holds or is computing (the longest prefix any candidate
	// has): fleet capacity spent twice on the same blocks. It keeps a
	// burst of requests that share a new prefix together until the
	// holder's queue costs more than computing the prefix again. 0 turns
	// it off. Default 0.75: a hot prefix is computed again once waiting
	// on its holder costs more than 1.75× its prefill.
	DuplicatePrefillWeight float64
	// CacheChurnWeight weighs, in the latency cost, a request's own
	// uncached tokens (in seconds of prefill) by how many uncached tokens
	// the worker took lately relative to the candidates' mean (decayed by
	// half every minute): each new token evicts one from the far end of a
	// cache, so sending them where caches turned over least keeps every
	// cache as long-lived as the fleet allows, and equal workers are not
	// told apart by noise in their learned rates. 0 turns it off. Default
	// 0.1.
	CacheChurnWeight float64
	// Temperature 0 picks the best logit; T>0 samples from
	// softmax(−logit ÷ (range × T)). Default 0.
	Temperature float64
	// NoTrackPrefillTokens leaves the worker's prefill tokens in flight out
	// of prefill_blocks (--no-track-prefill-tokens). Default false.
	NoTrackPrefillTokens bool
	// WeightedA, WeightedB and WeightedC are the weighted cost model's
	// coefficients for overlap ratio, KV usage and normalized waiting;
	// defaults 2, 1, 1.
	WeightedA, WeightedB, WeightedC float64

	// QueueThreshold: a request waits only when every eligible worker has
	// more than QueueThreshold × max_num_batched_tokens prefill tokens in
	// flight. Default 4.0; 0 or negative disables queueing.
	QueueThreshold float64
	// QueuePolicy orders waiters: "fcfs" (default), "wspt" or "lcfs".
	QueuePolicy string
	// QueueMaxLength bounds the waiters across all models; past it new
	// requests are shed. Default 1024.
	QueueMaxLength int
	// QueueMaxWait bounds one waiter's time in the queue; past it the
	// request is shed. Default 30 s.
	QueueMaxWait time.Duration

	// MaxRequestAge force-frees requests older than this (Sweep), so nothing
	// leaks when a stream vanishes. Default 300 s.
	MaxRequestAge time.Duration
	// StaleReportAge: a load report received longer ago than this is
	// ignored by the cost. Default 2 s (eight missed 250 ms reports).
	StaleReportAge time.Duration

	// PendingTTL is how long the prompt blocks routed to a worker count as
	// overlap before the worker's KV events confirm them (the pending
	// overlay: see Pool.BlocksStored); 0 turns it off. DefaultOptions sets
	// DefaultPendingTTL.
	PendingTTL time.Duration
	// PendingMaxBlocks bounds each worker's pending records; past it the
	// oldest are dropped first. Default DefaultPendingMaxBlocks.
	PendingMaxBlocks int

	// EjectAfter is how many consecutive failed requests (5xx, connect
	// failure, reset before the response) eject a worker; negative turns
	// passive health off. Default 2 (DefaultEjectAfter).
	EjectAfter int
	// EjectBackoff is the first ejection's length, doubled on each further
	// ejection without a success and capped at EjectBackoffMax. Defaults
	// 2 s and 60 s.
	EjectBackoff, EjectBackoffMax time.Duration

	// Now is the clock; default time.Now.
	Now func() time.Time
	// Rand is the random source for ties and sampling; default a
	// randomly seeded PCG. It is used under a lock, so any Rand works.
	Rand Rand
	// Metrics receives counters; default none.
	Metrics Metrics
	// Recorder, when set, learns every routing decision the Scheduler makes
	// (the approximate index of the kv_without_events mode). Default none.
	Recorder PrefixRecorder
}

// PrefixRecorder learns which worker a prompt's blocks were sent to, so an
// index without KV events can predict the cache. kvindex's approximate
// index satisfies it; the interface lives here, with its consumer.
type PrefixRecorder interface {
	Record(worker string, hashes []uint64)
}

// Defaults of Options, as documented on its fields.
const (
	DefaultOverlapCredit      = 1.0
	DefaultPrefillLoadScale   = 1.0
	DefaultHostCacheHitWeight = 0.75
	DefaultDiskCacheHitWeight = 0.25
	DefaultPrefillRate        = 20000.0
	DefaultPrefillOverhead    = 25 * time.Millisecond
	// DefaultPrefillContextCost is FlashAttention's cost per token pair on
	// one H100 for a Llama-3-8B-shaped model in bf16 (the h100-llama3-8b
	// timing profile): 1.7e-6 ms.
	DefaultPrefillContextCost = 1.7e-9
	// DefaultDecodeKVCost is a decode step's cost per KV token read on one
	// H100 for a Llama-3-8B-shaped model in bf16 (the h100-llama3-8b
	// timing profile: a step costs about 5.6 ms + 0.051 ms per thousand KV
	// tokens read).
	DefaultDecodeKVCost = 5.1e-8
	// DefaultMaxNumBatchedTokens is the pass size the latency cost assumes
	// for a worker that does not state its max_num_batched_tokens (vLLM's
	// default for its OpenAI server).
	DefaultMaxNumBatchedTokens  = 8192
	DefaultDecodeSlowdownWeight = 0.25
	DefaultDuplicatePrefill     = 0.75
	DefaultCacheChurnWeight     = 0.1
	DefaultDecodeActiveRequests = 8.0
	DefaultTemperature          = 0.0
	DefaultQueueThreshold       = 4.0
	DefaultQueuePolicy          = "fcfs"
	DefaultQueueMaxLength       = 1024
	DefaultQueueMaxWait         = 30 * time.Second
	DefaultMaxRequestAge        = 300 * time.Second
	DefaultStaleReportAge       = 2 * time.Second
	DefaultMode                 = "kv"
)

// DefaultOptions returns the documented defaults.
func DefaultOptions() Options {
	return Options{
		Mode:                      DefaultMode,
		CostModel:                 CostLatency,
		OverlapCredit:             DefaultOverlapCredit,
		PrefillLoadScale:          DefaultPrefillLoadScale,
		HostCacheHitWeight:        DefaultHostCacheHitWeight,
		DiskCacheHitWeight:        DefaultDiskCacheHitWeight,
		PrefillRate:               DefaultPrefillRate,
		PrefillOverhead:           DefaultPrefillOverhead,
		PrefillContextCost:        DefaultPrefillContextCost,
		DecodeKVCost:              DefaultDecodeKVCost,
		DecodeSlowdownWeight:      DefaultDecodeSlowdownWeight,
		DuplicatePrefillWeight:    DefaultDuplicatePrefill,
		CacheChurnWeight:          DefaultCacheChurnWeight,
		DecodeActiveRequestWeight: DefaultDecodeActiveRequests,
		Temperature:               DefaultTemperature,
		WeightedA:                 2,
		WeightedB:                 1,
		WeightedC:                 1,
		QueueThreshold:            DefaultQueueThreshold,
		QueuePolicy:               DefaultQueuePolicy,
		QueueMaxLength:            DefaultQueueMaxLength,
		QueueMaxWait:              DefaultQueueMaxWait,
		MaxRequestAge:             DefaultMaxRequestAge,
		StaleReportAge:            DefaultStaleReportAge,
		PendingTTL:                DefaultPendingTTL,
		EjectAfter:                DefaultEjectAfter,
		EjectBackoff:              DefaultEjectBackoff,
		EjectBackoffMax:           DefaultEjectBackoffMax,
	}
}

// withDefaults fills the fields whose zero value means "default".
func (o Options) withDefaults() Options {
	if o.Mode == "" {
		o.Mode = DefaultMode
	}
	if o.CostModel == "" {
		o.CostModel = CostDefault
	}
	if o.OverlapWeight > 0 {
		o.PrefillLoadScale, o.OverlapCredit = o.OverlapWeight, 1
	}
	if !(o.PrefillRate > 0) {
		o.PrefillRate = DefaultPrefillRate
	}
	if o.PrefillOverhead == 0 {
		o.PrefillOverhead = DefaultPrefillOverhead
	}
	if o.QueuePolicy == "" {
		o.QueuePolicy = DefaultQueuePolicy
	}
	if o.QueueMaxLength == 0 {
		o.QueueMaxLength = DefaultQueueMaxLength
	}
	if o.QueueMaxWait == 0 {
		o.QueueMaxWait = DefaultQueueMaxWait
	}
	if o.MaxRequestAge == 0 {
		o.MaxRequestAge = DefaultMaxRequestAge
	}
	if o.StaleReportAge == 0 {
		o.StaleReportAge = DefaultStaleReportAge
	}
	if o.PendingMaxBlocks <= 0 {
		o.PendingMaxBlocks = DefaultPendingMaxBlocks
	}
	if o.EjectAfter == 0 {
		o.EjectAfter = DefaultEjectAfter
	}
	if o.EjectBackoff <= 0 {
		o.EjectBackoff = DefaultEjectBackoff
	}
	if o.EjectBackoffMax <= 0 {
		o.EjectBackoffMax = DefaultEjectBackoffMax
	}
	if o.EjectBackoffMax < o.EjectBackoff {
		o.EjectBackoffMax = o.EjectBackoff
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	switch o.Rand.(type) {
	case nil:
		o.Rand = runtimeRand{}
	case *lockedRand, runtimeRand:
	default: // a caller's source, e.g. a seeded *rand.Rand, is not safe for concurrent use
		o.Rand = &lockedRand{r: o.Rand}
	}
	if o.Metrics == nil {
		o.Metrics = NopMetrics{}
	}
	return o
}

// Validate reports the first option that cannot work.
func (o Options) Validate() error {
	o = o.withDefaults()
	if _, ok := modeFactories[normalizeName(o.Mode)]; !ok {
		return fmt.Errorf("scoring options: unknown router mode %q (valid: %s)", o.Mode, strings.Join(ModeNames(), ", "))
	}
	if !slices.Contains(CostModels(), o.CostModel) {
		return fmt.Errorf("scoring options: unknown cost model %q (valid: %s)", o.CostModel, strings.Join(CostModels(), ", "))
	}
	if _, err := ParsePolicy(o.QueuePolicy); err != nil {
		return fmt.Errorf("scoring options: %w", err)
	}
	for name, v := range map[string]float64{
		"overlap weight": o.OverlapWeight, "temperature": o.Temperature,
		"overlap credit": o.OverlapCredit, "prefill load scale": o.PrefillLoadScale,
		"host cache hit weight": o.HostCacheHitWeight, "disk cache hit weight": o.DiskCacheHitWeight,
		"decode active request weight": o.DecodeActiveRequestWeight, "decode slowdown weight": o.DecodeSlowdownWeight,
		"duplicate prefill weight": o.DuplicatePrefillWeight, "prefill context cost": o.PrefillContextCost,
		"decode kv cost":     o.DecodeKVCost,
		"cache churn weight": o.CacheChurnWeight,
		"weighted a":         o.WeightedA, "weighted b": o.WeightedB, "weighted c": o.WeightedC,
	} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("scoring options: %s %g must be a finite number ≥ 0", name, v)
		}
	}
	if math.IsNaN(o.QueueThreshold) || math.IsInf(o.QueueThreshold, 0) {
		return fmt.Errorf("scoring options: queue threshold %g must be finite", o.QueueThreshold)
	}
	if o.PrefillOverhead < 0 {
		return fmt.Errorf("scoring options: prefill overhead %s must not be negative", o.PrefillOverhead)
	}
	if o.QueueMaxLength < 0 || o.QueueMaxWait < 0 || o.MaxRequestAge < 0 || o.StaleReportAge < 0 || o.PendingTTL < 0 {
		return fmt.Errorf("scoring options: queue limits and ages must not be negative")
	}
	return nil
}
