package scoring

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Scheduler ties a Pool, a Mode and the admission queue together. It is safe
// for concurrent use.
//
// Per request the caller (the ext_proc layer) builds the candidates with
// Pool.AppendCandidates, fills in their overlap from the KV index when
// Mode().Overlap() asks for it, and calls Route, which waits in the
// admission queue if every candidate is saturated, picks a worker and Adds
// the request to the pool. As the response streams the caller reports
// Pool().PrefillDone, Pool().Progress and finally Pool().Free.
type Scheduler struct {
	pool  *Pool
	mode  atomic.Pointer[currentMode] // swapped whole by SetMode and Reconfigure
	opts  Options                     // as built; the reloadable fields in use are mode.Load().opts
	queue *admission                  // nil when queueing is disabled
}

// currentMode is the mode in use, the name it was asked for and the
// options it was built from. It is immutable once stored: a pick loads it
// once, so a reload never mixes two configurations within one decision.
type currentMode struct {
	Mode
	name string
	opts Options
}

// NewScheduler builds a router with an empty pool. Register workers with
// Pool().Upsert.
func NewScheduler(opts Options) (*Scheduler, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	mode, err := NewMode(opts.Mode, opts)
	if err != nil {
		return nil, err
	}
	r := &Scheduler{pool: NewPool(opts), opts: opts}
	r.mode.Store(&currentMode{Mode: mode, name: opts.Mode, opts: opts})
	if opts.QueueThreshold > 0 {
		policy, _ := ParsePolicy(opts.QueuePolicy) // validated above
		r.queue = newAdmission(r, policy)
		r.pool.setCapacityListener(r.queue.kick)
	}
	return r, nil
}

// Pool returns the router's worker pool.
func (r *Scheduler) Pool() *Pool { return r.pool }

// Mode returns the mode in use.
func (r *Scheduler) Mode() Mode { return r.mode.Load().Mode }

// SetMode switches the mode in place (for A/B runs and /admin/mode): the
// next pick uses a mode built from name and the scheduler's options. The
// pool, its live load and the admission queue stay as they are; requests
// already waiting are picked by the new mode with the overlap they arrived
// with. On error the mode in use is kept.
func (r *Scheduler) SetMode(name string) error {
	opts := r.mode.Load().opts
	opts.Mode = name
	mode, err := NewMode(name, opts)
	if err != nil {
		return fmt.Errorf("set mode %q: %w", name, err)
	}
	r.mode.Store(&currentMode{Mode: mode, name: name, opts: opts})
	return nil
}

// Reconfigure applies next's reloadable options in place, atomically: the
// mode, the cost model and its weights (CostModel, OverlapCredit,
// PrefillLoadScale, HostCacheHitWeight, DiskCacheHitWeight,
// DecodeActiveRequestWeight, DecodeSlowdownWeight, DuplicatePrefillWeight,
// CacheChurnWeight, NoTrackPrefillTokens, Temperature, WeightedA, B and C)
// and the queue's limits (QueueThreshold, QueueMaxLength, QueueMaxWait).
// Every other field belongs to the pool or the queue's structure and is
// ignored (changing those needs a new Scheduler). Turning the queue on or off, or changing its
// policy, is refused, and so is an invalid next; on error the
// configuration in use is kept. Picks already under way finish with the
// configuration they started with.
func (r *Scheduler) Reconfigure(next Options) error {
	if err := next.Validate(); err != nil {
		return err
	}
	next = next.withDefaults()
	if (next.QueueThreshold > 0) != (r.queue != nil) {
		return fmt.Errorf("reconfigure: turning the admission queue on or off (queue threshold %g) needs a restart", next.QueueThreshold)
	}
	if r.queue != nil && next.QueuePolicy != r.opts.QueuePolicy {
		return fmt.Errorf("reconfigure: queue policy %q → %q needs a restart", r.opts.QueuePolicy, next.QueuePolicy)
	}
	opts := r.opts
	opts.Mode, opts.CostModel = next.Mode, next.CostModel
	opts.OverlapCredit, opts.PrefillLoadScale, opts.OverlapWeight = next.OverlapCredit, next.PrefillLoadScale, next.OverlapWeight
	opts.HostCacheHitWeight, opts.DiskCacheHitWeight = next.HostCacheHitWeight, next.DiskCacheHitWeight
	opts.DecodeActiveRequestWeight, opts.DecodeSlowdownWeight = next.DecodeActiveRequestWeight, next.DecodeSlowdownWeight
	opts.DuplicatePrefillWeight, opts.CacheChurnWeight = next.DuplicatePrefillWeight, next.CacheChurnWeight
	opts.NoTrackPrefillTokens, opts.Temperature = next.NoTrackPrefillTokens, next.Temperature
	opts.WeightedA, opts.WeightedB, opts.WeightedC = next.WeightedA, next.WeightedB, next.WeightedC
	opts.QueueThreshold, opts.QueueMaxLength, opts.QueueMaxWait = next.QueueThreshold, next.QueueMaxLength, next.QueueMaxWait
	mode, err := NewMode(opts.Mode, opts)
	if err != nil {
		return fmt.Errorf("reconfigure: %w", err)
	}
	r.mode.Store(&currentMode{Mode: mode, name: opts.Mode, opts: opts})
	if r.queue != nil {
		r.queue.kick() // a higher threshold or a longer line may admit waiters now
	}
	return nil
}

// Options returns the scheduler's options in use, with defaults filled
// in; Mode is the mode in use.
func (r *Scheduler) Options() Options {
	cur := r.mode.Load()
	o := cur.opts
	o.Mode = cur.name
	return o
}

// limits returns the options in use (for the queue's threshold and limits).
func (r *Scheduler) limits() *Options { return &r.mode.Load().opts }

var loadScratch = sync.Pool{New: func() any { s := make([]Load, 0, 64); return &s }}

// Pick chooses a worker for req among cands without adding load. A mode
// that keeps its own state (round_robin's counter) advances it. Candidates
// the pool does not know are skipped; if none is left Pick returns
// ErrNoWorkers. exp, when not nil, receives every worker's terms.
func (r *Scheduler) Pick(req *Request, cands []Candidate, exp *Explanation) (Decision, error) {
	d, _, err := r.decide(req, cands, exp, 0, false)
	return d, err
}

// Preview is Pick without any side effect: a mode that keeps state answers
// what it would pick next and leaves that state as it is (Previewer), so
// /debug/explain can be asked any number of times without moving the
// decisions that real requests get.
func (r *Scheduler) Preview(req *Request, cands []Candidate, exp *Explanation) (Decision, error) {
	d, _, err := r.decide(req, cands, exp, 0, true)
	return d, err
}

// decide picks unless threshold > 0 and every candidate is saturated, in
// which case it reports saturated and picks nothing. A kv mode at
// temperature 0 without an explanation takes Pool.decidePruned
// (scoring/prune.go): the same decision, without a Load for most
// candidates.
func (r *Scheduler) decide(req *Request, cands []Candidate, exp *Explanation, threshold float64, preview bool) (d Decision, saturated bool, err error) {
	mode := r.Mode()
	pending := r.opts.PendingTTL > 0 && mode.Overlap() == OverlapEvents
	if kv, ok := mode.(*KV); ok && kv.prunable(exp) && len(cands) >= pruneAt {
		return r.pool.decidePruned(req, cands, pending, kv, threshold)
	}
	return r.decideFull(req, cands, exp, threshold, preview, mode, pending)
}

// decideFull is decide with every candidate's Load.
func (r *Scheduler) decideFull(req *Request, cands []Candidate, exp *Explanation, threshold float64, preview bool, mode Mode, pending bool) (d Decision, saturated bool, err error) {
	sp := loadScratch.Get().(*[]Load)
	loads := keepBestTier(r.pool.appendLoads((*sp)[:0], req, cands, pending))
	defer func() {
		*sp = loads[:0]
		loadScratch.Put(sp)
	}()
	if len(loads) == 0 {
		return Decision{}, false, fmt.Errorf("pick for model %q among %d candidates: %w", req.Model, len(cands), ErrNoWorkers)
	}
	if threshold > 0 && allSaturated(loads, threshold) {
		return Decision{}, true, nil
	}
	var idx int
	if pv, ok := mode.(Previewer); ok && preview {
		idx = pv.Preview(req, loads, exp)
	} else {
		idx = mode.Pick(req, loads, exp)
	}
	l := &loads[idx]
	return Decision{Worker: l.ID, Cluster: l.Cluster, Address: l.Address, Index: l.index,
		MatchedBlocks: l.MatchedBlocks, PendingBlocks: l.PendingBlocks, ForecastLostBlocks: l.ForecastLostBlocks}, false, nil
}

// allSaturated reports whether every worker has more than threshold ×
// max_num_batched_tokens prefill tokens in flight. A worker whose
// max_num_batched_tokens is unknown is never saturated, nor is one whose
// latest report shows it idle (Load.ReportIdle): the engine itself says the
// router's count is stale, e.g. after a lost PrefillDone.
func allSaturated(loads []Load, threshold float64) bool {
	for i := range loads {
		if !loads[i].saturated(threshold) {
			return false
		}
	}
	return true
}

// saturated reports whether l has more than threshold ×
// max_num_batched_tokens prefill tokens in flight (see allSaturated).
func (l *Load) saturated(threshold float64) bool {
	return l.MaxNumBatchedTokens != 0 && !l.ReportIdle &&
		!(float64(l.PrefillTokens) <= threshold*float64(l.MaxNumBatchedTokens))
}

// commit adds a picked request to the pool and tells the recorder.
func (r *Scheduler) commit(req *Request, d Decision) error {
	if err := r.pool.addLocal(req, d.Worker, d.MatchedBlocks, d.MatchedBlocks-d.PendingBlocks); err != nil {
		return fmt.Errorf("route %q: %w", req.ID, err)
	}
	if r.opts.Recorder != nil && len(req.Hashes) > 0 {
		r.opts.Recorder.Record(d.Worker, req.Hashes)
	}
	r.opts.Metrics.Routed(r.Mode().Name(), d.Worker)
	if d.ForecastLostBlocks > 0 {
		r.opts.Metrics.HitForecastLost(d.ForecastLostBlocks * r.pool.blockSize(d.Worker))
	}
	return nil
}

// Route admits, picks and adds: it waits in the admission queue while
// every candidate is saturated with prefill work (see Options.
// QueueThreshold), then picks a worker and Adds req to the pool. It returns
// a *ShedError (errors.Is ErrShed) when the queue is full or the wait
// exceeds Options.QueueMaxWait, ctx's error when ctx ends first (the
// request then holds no load), and ErrNoWorkers when no candidate is
// known. On success the caller owns the lifecycle: PrefillDone, Progress
// and Free on Pool(). req and cands must not change until Route returns;
// a queued request is picked with the overlap it arrived with.
func (r *Scheduler) Route(ctx context.Context, req *Request, cands []Candidate, exp *Explanation) (Decision, error) {
	if r.queue == nil {
		d, err := r.Pick(req, cands, exp)
		if err != nil {
			return Decision{}, err
		}
		return d, r.commit(req, d)
	}
	return r.queue.admit(ctx, req, cands, exp)
}

// Submit is Route for a caller that must not block, such as the
// virtual-time simulator: done receives the outcome exactly once, either
// before Submit returns or later, from the lifecycle call (Free,
// PrefillDone, a load report) that makes room, or from ShedExpired. done
// may run with the queue's lock held, so it must not call the Scheduler.
func (r *Scheduler) Submit(req *Request, cands []Candidate, exp *Explanation, done func(Decision, error)) {
	if r.queue == nil {
		d, err := r.Pick(req, cands, exp)
		if err == nil {
			err = r.commit(req, d)
		}
		done(d, err)
		return
	}
	if d, ok, err := r.queue.tryNow(req, cands, exp); ok || err != nil {
		done(d, err)
		return
	}
	if _, err := r.queue.enqueue(req, cands, exp, done); err != nil {
		done(Decision{}, err)
	}
}

// ShedExpired sheds the requests given to Submit that have waited in the
// admission queue longer than Options.QueueMaxWait by the router's clock,
// and returns how many. Route's waiters time out by themselves.
func (r *Scheduler) ShedExpired() int {
	if r.queue == nil {
		return 0
	}
	return r.queue.shedExpired()
}

// QueueLen returns the number of requests waiting for admission.
func (r *Scheduler) QueueLen() int {
	if r.queue == nil {
		return 0
	}
	return int(r.queue.n.Load())
}

// Run force-frees requests past Options.MaxRequestAge every second (or
// every half maximum age, if that is shorter) until ctx ends.
func (r *Scheduler) Run(ctx context.Context) {
	tick := time.NewTicker(min(time.Second, r.opts.MaxRequestAge/2))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.pool.Sweep()
		}
	}
}
