// Package costflag registers the router's cost and admission flags on a
// flag set, so that kvroute serve and kvbench sim accept the same names,
// defaults and help text, and a setting tuned in simulation carries over
// to the router unchanged.
package costflag

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/kvroute/kvroute/scoring"
)

// Flags holds what Register bound; call Finish after parsing.
type Flags struct {
	o             *scoring.Options
	fs            *flag.FlagSet
	overlapWeight float64
	decay, learn  bool
	forecast      bool
}

// Register binds the cost and admission flags to o, whose current values
// are the defaults shown.
func Register(fs *flag.FlagSet, o *scoring.Options) *Flags {
	f := &Flags{o: o, fs: fs, decay: !o.NoPrefillDecay, learn: !o.NoLearnRates, forecast: !o.NoEvictionForecast}
	fs.StringVar(&o.CostModel, "cost-model", o.CostModel, "cost model of the kv modes: "+strings.Join(scoring.CostModels(), ", ")+
		". latency predicts each worker's time to first token from its learned prefill rate; default weighs KV blocks as Dynamo does (scale × max(prefill − credit × cached, 0) + decode); weighted is a·overlap − b·kv_usage − c·waiting")
	fs.Float64Var(&o.OverlapCredit, "kv-overlap-score-credit", o.OverlapCredit, "default cost: prefill blocks credited per device-cached block (above 1 also discounts the worker's backlog, favouring the cache more)")
	fs.Float64Var(&o.PrefillLoadScale, "prefill-load-scale", o.PrefillLoadScale, "default cost: weight of the credited prefill blocks against decode blocks (0 ignores prefill and the cache)")
	fs.Float64Var(&f.overlapWeight, "kv-overlap-score-weight", -1, "deprecated: sets --prefill-load-scale to this value and --kv-overlap-score-credit to 1 (the old cost weight × prefill + decode); -1 leaves them alone")
	fs.Float64Var(&o.HostCacheHitWeight, "host-cache-hit-weight", o.HostCacheHitWeight, "credit of a block offloaded to host memory, as a fraction of a device block")
	fs.Float64Var(&o.DiskCacheHitWeight, "disk-cache-hit-weight", o.DiskCacheHitWeight, "credit of a block offloaded to disk, as a fraction of a device block")
	fs.Float64Var(&o.DecodeActiveRequestWeight, "decode-active-request-weight", o.DecodeActiveRequestWeight, "default cost: block-equivalents added per active request on the worker")
	fs.Float64Var(&o.Temperature, "router-temperature", o.Temperature, "0 picks the lowest cost; T>0 samples from softmax(−logit/(range×T))")
	fs.BoolVar(&o.NoTrackPrefillTokens, "no-track-prefill-tokens", o.NoTrackPrefillTokens, "leave workers' prefill backlog out of the cost")
	fs.BoolVar(&f.decay, "prefill-backlog-decay", f.decay, "drain each worker's modelled prefill backlog at its prefill rate as time passes (false: charge a prefill whole until its first token)")
	fs.Float64Var(&o.PrefillRate, "prefill-rate", o.PrefillRate, "prior prefill speed of a worker in tokens/s, before it is learned")
	fs.DurationVar(&o.PrefillOverhead, "prefill-overhead", o.PrefillOverhead, "prior fixed part of a worker's time to first token, before it is learned")
	fs.Float64Var(&o.DecodeKVCost, "decode-kv-cost", o.DecodeKVCost, "cost in seconds of one engine pass reading one KV token of the worker's running requests: every pass a prompt needs until its first token also decodes the requests running beside it, so the latency cost charges passes × the worker's KV in use × this (the default is an H100 running a Llama-3-8B-shaped model; 0 turns the term off)")
	fs.Float64Var(&o.PrefillContextCost, "prefill-context-cost", o.PrefillContextCost, "prior cost in seconds of one prompt token attending to one cached or earlier token, before it is learned (the default is an H100 running a Llama-3-8B-shaped model; 0 leaves cached context out of the cost)")
	fs.BoolVar(&f.learn, "learn-prefill-rate", f.learn, "learn each worker's prefill rate, overhead, context cost and shared-pass cost from its times to first token (false: keep the priors)")
	fs.BoolVar(&f.forecast, "eviction-forecast", f.forecast, "count a worker's matched prefix as lost where the prefills queued ahead of the request would evict it first: each ended request marks its prompt's place in a shadow of the worker's least-recently-used free queue, which the blocks the worker stores, the hits sent to it and the evictions its KV events report move (false: a matched prefix always counts as cached)")
	fs.Float64Var(&o.DecodeSlowdownWeight, "decode-slowdown-weight", o.DecodeSlowdownWeight, "latency cost: per request active on the worker, weight of the seconds it would spend recomputing prompt blocks another worker holds (keeps sessions on their holders under overload; 0: off)")
	fs.Float64Var(&o.CacheChurnWeight, "cache-churn-weight", o.CacheChurnWeight, "latency cost: weight of a request's uncached tokens, in seconds of prefill, times the worker's recent uncached tokens (halved every minute) over the candidates' mean: sends what evicts where caches turned over least (0: off)")
	fs.Float64Var(&o.DuplicatePrefillWeight, "duplicate-prefill-weight", o.DuplicatePrefillWeight, "latency cost: weight of the seconds spent computing prompt blocks another worker already holds or is computing (0: off)")
	fs.Float64Var(&o.WeightedA, "weighted-a", o.WeightedA, "weighted cost: coefficient of the overlap ratio")
	fs.Float64Var(&o.WeightedB, "weighted-b", o.WeightedB, "weighted cost: coefficient of KV usage")
	fs.Float64Var(&o.WeightedC, "weighted-c", o.WeightedC, "weighted cost: coefficient of normalized waiting")
	fs.DurationVar(&o.PendingTTL, "pending-overlay-ttl", o.PendingTTL, "how long the prompt blocks just routed to a worker count as cached there before its KV events confirm them (the pending overlay; 0 turns it off)")
	fs.Float64Var(&o.QueueThreshold, "router-queue-threshold", o.QueueThreshold, "queue a request while every eligible worker has more than this × max_num_batched_tokens in prefill (0 disables the queue)")
	fs.StringVar(&o.QueuePolicy, "router-queue-policy", o.QueuePolicy, "admission queue order: "+strings.Join(scoring.PolicyNames(), ", "))
	fs.IntVar(&o.QueueMaxLength, "router-queue-max-length", o.QueueMaxLength, "waiting requests beyond which new ones are shed with 429")
	fs.DurationVar(&o.QueueMaxWait, "router-queue-max-wait", o.QueueMaxWait, "longest wait in the admission queue before 429")
	return f
}

// Finish applies what the flags imply beyond their own fields (the
// deprecated weight, the positive booleans) and says on note when a
// deprecated flag was used. It returns an error for an invalid value.
func (f *Flags) Finish(note io.Writer) error {
	o := f.o
	o.NoPrefillDecay, o.NoLearnRates, o.NoEvictionForecast = !f.decay, !f.learn, !f.forecast
	if f.overlapWeight >= 0 {
		if note != nil {
			fmt.Fprintf(note, "note: --kv-overlap-score-weight is deprecated; it sets --prefill-load-scale %g and --kv-overlap-score-credit 1\n", f.overlapWeight)
		}
		o.PrefillLoadScale, o.OverlapCredit, o.OverlapWeight = f.overlapWeight, 1, 0
	} else if f.overlapWeight != -1 {
		return fmt.Errorf("--kv-overlap-score-weight %g must be at least 0", f.overlapWeight)
	}
	return o.Validate()
}
