package scoring

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// Pool holds the fleet's workers and their live load. It is safe for
// concurrent use: lifecycle calls take its write lock for a few map
// operations, picks take the read lock once per decision.
type Pool struct {
	opts Options
	// churnEpoch is the reference time of every worker's churn; moved
	// forward (and the churns rescaled) before the weights could overflow.
	churnEpoch time.Time
	// epoch is the reference time of the worker summaries' times.
	epoch time.Time

	mu      sync.RWMutex
	workers map[string]*worker
	// models maps a model or LoRA adapter name to the workers serving it,
	// sorted by ID; rebuilt when registrations change.
	models map[string][]*worker
	// candidates holds, per name in models, the Candidates of its workers
	// in the same order: AppendCandidates copies them rather than reading
	// every worker.
	candidates map[string][]Candidate
	// sums holds, per name in models, its workers' summaries in the same
	// order (summary.go).
	sums map[string][]workerSummary
	// byAddress maps "ip:port" to worker ID, for endpoints the proxy reports.
	byAddress map[string]string
	reqs      map[string]*active
	tomb      tombstones
	// fleetFit learns from every worker's first tokens: the prior a worker
	// with few samples of its own leans on, so a newcomer is judged by its
	// peers rather than by the static prior.
	fleetFit rateFit

	// onCapacity is called, outside the lock, after anything that may free
	// capacity (Free, PrefillDone, Move, a load report, a registration).
	onCapacity atomic.Pointer[func()]
	// kickOwed: a worker's KV events ended a prefill under the index's
	// lock, where onCapacity may not run; AfterApply or Sweep runs it.
	kickOwed atomic.Bool
	// sink receives local lifecycle events for replica sync, outside the lock.
	sink atomic.Pointer[func(fleet.SyncEvent)]
}

// worker is one worker's static facts and live load. Guarded by Pool.mu.
//
// Every kv decision reads the fields up to fit's estimates of every
// candidate (decidePruned's first pass): they come first and together, in
// the first six cache lines, so that it touches few lines of each worker.
type worker struct {
	// removed is set when the worker leaves the pool, so a Candidate that
	// still points at it falls back to the ID lookup.
	removed   bool
	hasReport bool
	// blockSize, kvTotalBlocks and maxBatched are the spec's, set with it.
	blockSize, kvTotalBlocks, maxBatched int
	// private is the sum of the active requests' blocks that are not shared
	// prompt blocks (the partial last block and decode blocks).
	private         int
	requests        int
	prefillTokens   int
	prefillRequests int
	// stored counts the device blocks the worker's events reported
	// stored; allocDue is what it will reach once the prefills sent to
	// the worker have allocated their blocks (forecast.go): a pick reads
	// them for every candidate that matched.
	stored, allocDue uint64
	// refs is blockRefs.len(), kept with it: the table's header is a
	// cache line of its own.
	refs int
	// adds counts Adds and Moves onto the worker; reportAdds is its value
	// when the report arrived, so an idle report is trusted only if no
	// request was sent since.
	adds, reportAdds uint64
	// backlog models the prefill work ahead of a new request, in tokens:
	// it grows by each request's uncached tokens, drains at the learned
	// prefill rate since backlogAt, and never exceeds prefillTokens (the
	// work whose first token has not been seen).
	backlog float64
	// churn is the uncached prompt tokens routed to the worker, each
	// weighted by 2^((its time − Pool.churnEpoch) ÷ churnHalfLife): how
	// fast its cache turns over, in a form every worker shares, so that
	// reading it at a time t takes one factor for the whole pool.
	churn    float64
	report   fleet.LoadReport
	reportAt time.Time
	health   health
	// pending holds the prompt blocks recently routed to the worker that
	// its KV events have not confirmed (the pending overlay).
	pending pendingBlocks
	fit     rateFit

	spec fleet.Worker
	// blockRefs counts, per prompt block hash, the active requests holding
	// it, so a shared prefix counts once (blockrefs.go).
	blockRefs blockRefs
	// finished counts requests freed on the worker; reportFinished is its
	// value when the report arrived, so the requests that ended since are
	// known until the next report shows them gone.
	finished, reportFinished uint64
	backlogAt                time.Time
	// backlogAttn is the attention work (token pairs) of the same backlog;
	// it drains with backlog, by the same fraction of the predicted time,
	// and never exceeds prefillAttn.
	backlogAttn float64
	// prefillAttn is the attention work of the requests counted in
	// prefillTokens.
	prefillAttn float64
	// awaiting maps a prompt block to the local requests in prefill that
	// wait for its BlockStored as their first token (first_token.go);
	// storesBlocks is set once the worker's events reported a stored block.
	awaiting     map[uint64]*active
	storesBlocks bool
	// holding maps a prompt block to the local requests in prefill whose
	// dispatch counted it as the deepest block the worker held for them
	// (lost_hits.go).
	holding map[uint64][]*active
	// free is the shadow of the worker's free queue, and recency stamps
	// the prompt blocks of ended requests with their place in it
	// (forecast.go).
	recency map[uint64]recencyStamp
	free    freeQueue
	// static is the part of Load fixed by the spec, built on Upsert.
	static Load
	// sums are the worker's summaries, one per model it serves
	// (summary.go): whatever changes a field they hold calls
	// summarizeLocked.
	sums []*workerSummary
}

func (w *worker) activeBlocks() int { return w.refs + w.private }

// kvUsedBlocksLocked is Load.KVUsedBlocks for w at now.
func (p *Pool) kvUsedBlocksLocked(w *worker, now time.Time) int {
	if w.hasReport && now.Sub(w.reportAt) <= p.opts.StaleReportAge && w.report.KVUsedBlocks > w.activeBlocks() {
		return w.report.KVUsedBlocks
	}
	return w.activeBlocks()
}

// NewPool returns an empty pool. It uses opts' clock, ages and metrics.
func NewPool(opts Options) *Pool {
	return &Pool{
		opts:       opts.withDefaults(),
		epoch:      opts.withDefaults().Now(),
		sums:       make(map[string][]workerSummary),
		workers:    make(map[string]*worker),
		models:     make(map[string][]*worker),
		candidates: make(map[string][]Candidate),
		byAddress:  make(map[string]string),
		reqs:       make(map[string]*active),
		tomb:       newTombstones(4096),
		fleetFit:   newRateFit(opts.withDefaults().PrefillRate, opts.withDefaults().PrefillOverhead, opts.withDefaults().PrefillContextCost),
	}
}

// Upsert adds a worker or updates its static facts, keeping its live load.
func (p *Pool) Upsert(spec fleet.Worker) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("pool upsert: %w", err)
	}
	spec.LoRAAdapters = slices.Clone(spec.LoRAAdapters)
	p.mu.Lock()
	w, ok := p.workers[spec.ID]
	// A worker that serves the same names at the same address keeps its
	// places in the model lists: refreshing its facts is enough.
	same := ok && w.spec.Model == spec.Model && w.spec.Address == spec.Address && slices.Equal(w.spec.LoRAAdapters, spec.LoRAAdapters)
	if !ok {
		w = &worker{fit: newRateFit(p.opts.PrefillRate, p.opts.PrefillOverhead, p.opts.PrefillContextCost)}
		p.workers[spec.ID] = w
	}
	w.spec = spec
	w.blockSize, w.kvTotalBlocks, w.maxBatched = spec.BlockSize, spec.KVTotalBlocks, spec.MaxNumBatchedTokens
	w.static = Load{ID: spec.ID, Cluster: spec.ClusterName(), Address: spec.Address, BlockSize: spec.BlockSize,
		KVTotalBlocks: spec.KVTotalBlocks, MaxNumBatchedTokens: spec.MaxNumBatchedTokens, Weight: spec.EffectiveWeight()}
	if same {
		p.summarizeLocked(w)
	} else {
		p.rebuildModelsLocked()
	}
	p.mu.Unlock()
	p.capacityChanged()
	return nil
}

// Remove forgets a worker and every request active on it. Unknown IDs are
// ignored.
func (p *Pool) Remove(id string) {
	p.mu.Lock()
	w, ok := p.workers[id]
	if ok {
		w.removed = true
		delete(p.workers, id)
		for key, a := range p.reqs {
			if a.w == w {
				delete(p.reqs, key)
			}
		}
		p.rebuildModelsLocked()
	}
	p.mu.Unlock()
	if ok {
		p.capacityChanged()
	}
}

func (p *Pool) rebuildModelsLocked() {
	clear(p.models)
	clear(p.byAddress)
	for _, w := range p.workers {
		if w.spec.Address != "" {
			p.byAddress[w.spec.Address] = w.spec.ID
		}
		p.models[w.spec.Model] = append(p.models[w.spec.Model], w)
		for _, a := range w.spec.LoRAAdapters {
			if a != w.spec.Model {
				p.models[a] = append(p.models[a], w)
			}
		}
	}
	clear(p.candidates)
	for name, ws := range p.models {
		slices.SortFunc(ws, func(a, b *worker) int {
			switch {
			case a.spec.ID < b.spec.ID:
				return -1
			case a.spec.ID > b.spec.ID:
				return 1
			}
			return 0
		})
		cs := make([]Candidate, len(ws))
		for i, w := range ws {
			cs[i] = Candidate{Worker: w.spec.ID, w: w}
		}
		p.candidates[name] = cs
	}
	p.rebuildSummariesLocked()
}

// AppendCandidates appends one Candidate (overlap zero) per worker serving
// model, as base model or LoRA adapter, in ID order, and returns the
// extended slice. Callers restrict it to a subset and fill in the overlap.
func (p *Pool) AppendCandidates(dst []Candidate, model string) []Candidate {
	p.mu.RLock()
	dst = append(dst, p.candidates[model]...)
	p.mu.RUnlock()
	return dst
}

// AppendCandidatesFunc is AppendCandidates restricted to the workers keep
// accepts, for a subset hint that names workers by ID or address.
func (p *Pool) AppendCandidatesFunc(dst []Candidate, model string, keep func(id, address string) bool) []Candidate {
	p.mu.RLock()
	sums := p.sums[model]
	for i, w := range p.models[model] {
		if keep(w.spec.ID, w.spec.Address) {
			dst = append(dst, Candidate{Worker: w.spec.ID, w: w, s: &sums[i]})
		}
	}
	p.mu.RUnlock()
	return dst
}

// WorkerByAddress returns the ID of the worker at "ip:port", for when the
// proxy reports the endpoint that served a request (see Move).
func (p *Pool) WorkerByAddress(address string) (string, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	id, ok := p.byAddress[address]
	return id, ok
}

// Spec returns a worker's static facts.
func (p *Pool) Spec(id string) (fleet.Worker, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	w, ok := p.workers[id]
	if !ok {
		return fleet.Worker{}, false
	}
	return w.spec, true
}

// Models returns the model and adapter names served, sorted.
func (p *Pool) Models() []string {
	p.mu.RLock()
	out := make([]string, 0, len(p.models))
	for m := range p.models {
		out = append(out, m)
	}
	p.mu.RUnlock()
	slices.Sort(out)
	return out
}

// Len returns the number of workers.
func (p *Pool) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.workers)
}

// SetLoadReport records a worker's latest load report, received now. A
// report with nothing running or waiting clears the peers' requests on the
// worker older than a second: phantoms a dead peer left behind. It returns ErrUnknownWorker for a worker the pool does not hold.
func (p *Pool) SetLoadReport(id string, r fleet.LoadReport) error {
	now := p.opts.Now()
	p.mu.Lock()
	w, ok := p.workers[id]
	if ok {
		w.report, w.reportAt, w.hasReport, w.reportAdds, w.reportFinished = r, now, true, w.adds, w.finished
		if r.Running == 0 && r.Waiting == 0 {
			p.clearPhantomsLocked(w, now)
		}
		p.summarizeLocked(w)
	}
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("load report for %q: %w", id, ErrUnknownWorker)
	}
	p.capacityChanged()
	return nil
}

// Load is a snapshot of one worker as the router modes see it: static
// facts, live load and, inside a pick, the candidate's overlap.
type Load struct {
	ID                  string  `json:"id"`
	Cluster             string  `json:"cluster"`
	Address             string  `json:"address"`
	BlockSize           int     `json:"block_size"`
	KVTotalBlocks       int     `json:"kv_total_blocks"`
	MaxNumBatchedTokens int     `json:"max_num_batched_tokens"`
	Weight              float64 `json:"weight"`
	// ActiveBlocks counts the KV blocks of the worker's active requests,
	// each unique prompt block once.
	ActiveBlocks int `json:"active_blocks"`
	// ActiveRequests counts the worker's active requests.
	ActiveRequests int `json:"active_requests"`
	// PrefillTokens is the uncached prompt tokens of requests whose first
	// token has not arrived yet.
	PrefillTokens int `json:"prefill_tokens"`
	// PrefillRequests counts those requests.
	PrefillRequests int `json:"prefill_requests"`
	// Report is the latest load report and ReportFresh whether it is recent
	// enough to use (younger than Options.StaleReportAge).
	Report      fleet.LoadReport `json:"report"`
	ReportFresh bool             `json:"report_fresh"`
	// FinishedSinceReport counts the worker's requests whose response
	// ended after Report arrived: Report.Running still counts them until
	// the next report (kvsim reports every 200 ms, a scraped engine at its
	// scrape interval).
	FinishedSinceReport int `json:"finished_since_report"`
	// ReportIdle is set when a fresh report shows nothing running or
	// waiting and no request was sent to the worker since it arrived.
	ReportIdle bool `json:"report_idle"`
	// ReportSilent is set when the worker did send load reports and the
	// latest is older than Options.StaleReportAge: it stopped reporting,
	// so picks prefer workers that still report.
	ReportSilent bool `json:"report_silent,omitempty"`
	// Ejected is set while passive health has the worker ejected (see
	// Pool.Observe); picks use it only when every candidate is ejected.
	Ejected bool `json:"ejected,omitempty"`
	// Cooling is set for a short while after the proxy answered a
	// request for the worker itself (ObserveLocalReply); picks pass it
	// over while a worker that is not cooling is left.
	Cooling bool `json:"cooling,omitempty"`
	// PrefillBacklog is the modelled prefill work still ahead, in tokens:
	// PrefillTokens drained at the learned model's pace since it was
	// queued. PrefillBacklogAttention is the same work's attention over
	// context, in token pairs (see PrefillContext).
	PrefillBacklog          float64 `json:"prefill_backlog"`
	PrefillBacklogAttention float64 `json:"prefill_backlog_attention"`
	// PrefillRate (tokens/s), PrefillOverhead (s) and PrefillContext (s
	// per token pair: one new token attending to one cached or earlier
	// token) are the worker's learned prefill model; FitSamples counts
	// what it learned from.
	PrefillRate     float64 `json:"prefill_rate"`
	PrefillOverhead float64 `json:"prefill_overhead_seconds"`
	PrefillContext  float64 `json:"prefill_context_seconds"`
	// PrefillPass is the learned extra cost (s) of each prefill pass that
	// shares the engine with other active requests (see rateFit).
	PrefillPass float64 `json:"prefill_pass_seconds"`
	FitSamples  int     `json:"fit_samples"`
	// MatchedBlocks and CachedBlocks come from the Candidate in a pick;
	// HostBlocks and DiskBlocks are the blocks after MatchedBlocks held
	// off the device. MatchedBlocks includes PendingBlocks: the blocks
	// after the Candidate's that the pending overlay holds for the worker.
	MatchedBlocks int `json:"matched_blocks"`
	PendingBlocks int `json:"pending_blocks,omitempty"`
	CachedBlocks  int `json:"cached_blocks"`
	// ForecastLostBlocks is how many matched blocks the eviction forecast
	// took off MatchedBlocks: the allocations queued ahead on the worker
	// would evict them before the request runs (forecast.go).
	ForecastLostBlocks int `json:"forecast_lost_blocks,omitempty"`
	// Churn is the uncached prompt tokens recently routed to the worker
	// (decayed by half every ChurnHalfLife): how fast its cache turns
	// over. Ties go to the lowest.
	Churn      float64 `json:"churn_tokens"`
	HostBlocks int     `json:"host_blocks"`
	DiskBlocks int     `json:"disk_blocks"`

	// index is the candidate's index in the caller's slice.
	index int
	// logit is scratch for the mode: lower is better.
	logit float64
	// weight is scratch for sampling.
	weight float64
}

// KVUsedBlocks is the worker's KV blocks in use: the router's own count, or
// the fresh load report's when that is higher (it also sees traffic other
// routers sent).
func (l *Load) KVUsedBlocks() int {
	if l.ReportFresh && l.Report.KVUsedBlocks > l.ActiveBlocks {
		return l.Report.KVUsedBlocks
	}
	return l.ActiveBlocks
}

// Waiting is the worker's queue: the fresh load report's waiting count, or
// else the router's count of requests still in prefill.
func (l *Load) Waiting() int {
	if l.ReportFresh {
		return l.Report.Waiting
	}
	return l.PrefillRequests
}

func (p *Pool) loadLocked(w *worker, now time.Time) Load {
	l := w.static
	p.fillLoadLocked(&l, w, now, p.churnFactorLocked(now))
	return l
}

// fillLoadLocked sets l's live fields from w; churn is
// churnFactorLocked(now).
func (p *Pool) fillLoadLocked(l *Load, w *worker, now time.Time, churn float64) {
	fresh := w.hasReport && now.Sub(w.reportAt) <= p.opts.StaleReportAge
	l.ActiveBlocks = w.activeBlocks()
	l.ActiveRequests = w.requests
	l.PrefillTokens = w.prefillTokens
	l.PrefillRequests = w.prefillRequests
	l.Report = w.report
	l.ReportFresh = fresh
	l.FinishedSinceReport = int(w.finished - w.reportFinished)
	l.ReportIdle = fresh && w.report.Running == 0 && w.report.Waiting == 0 && w.reportAdds == w.adds
	l.ReportSilent = w.hasReport && !fresh
	l.Ejected = w.health.ejectedUntil.After(now)
	l.Cooling = w.health.coolUntil.After(now)
	l.PrefillRate, l.PrefillOverhead, l.PrefillContext, l.FitSamples = p.blendedFitLocked(w)
	l.PrefillPass = p.blendPassLocked(w.fit.pass, fitShare(w.fit.samples))
	l.Churn = w.churn * churn
	l.PrefillBacklog, l.PrefillBacklogAttention = w.backlogNow(now, l.PrefillRate, l.PrefillOverhead, l.PrefillContext, l.PrefillPass, p.opts.NoPrefillDecay)
}

// ownSamples is how many samples of its own a worker needs before its fit
// counts as much as the fleet's: a fleet of equal GPUs should not be told
// apart by the noise in their fits, while a slower worker still shows
// after a few hundred requests.
const ownSamples = 200

// blendedFitLocked is w's prefill model shrunk toward the fleet's.
func (p *Pool) blendedFitLocked(w *worker) (rate, overhead, context float64, samples int) {
	rate, overhead, context = p.blendShareLocked(w.fit.rate, w.fit.overhead, w.fit.context, fitShare(w.fit.samples))
	return rate, overhead, context, w.fit.samples
}

// fitShare is the weight of a worker's own fit of samples samples in the
// blend with the fleet's.
func fitShare(samples int) float64 {
	n := float64(samples)
	return n / (n + ownSamples)
}

// blendShareLocked blends a worker's own fit, of share a, with the
// fleet's. Worker summaries keep a, which costs a division.
func (p *Pool) blendShareLocked(rate, overhead, context, a float64) (float64, float64, float64) {
	if p.fleetFit.samples == 0 {
		return rate, overhead, context
	}
	return a*rate + (1-a)*p.fleetFit.rate, a*overhead + (1-a)*p.fleetFit.overhead,
		a*context + (1-a)*p.fleetFit.context
}

// blendPassLocked blends a worker's own pass cost, of share a, with the
// fleet's, as blendShareLocked does the rest of the fit.
func (p *Pool) blendPassLocked(pass, a float64) float64 {
	if p.fleetFit.samples == 0 {
		return pass
	}
	return a*pass + (1-a)*p.fleetFit.pass
}

// backlogNow is the modelled prefill backlog at now, in tokens and in
// attention work, without changing it. The backlog drains one second per
// second of the time the model predicts for it (its passes shared when
// more than one request is active); both parts drain by the same
// fraction.
func (w *worker) backlogNow(now time.Time, rate, overhead, context, pass float64, noDecay bool) (tokens, attn float64) {
	if noDecay {
		return float64(w.prefillTokens), w.prefillAttn
	}
	b, ba := w.backlog, w.backlogAttn
	if b <= 0 {
		// Most workers of a large fleet have no backlog: skip the clock
		// arithmetic, a good part of building each Load.
		return 0, 0
	}
	if dt := now.Sub(w.backlogAt).Seconds(); dt > 0 {
		if secs := overhead + b/rate + context*ba + pass*sharedPasses(b, w.requests-1, w.maxBatched); secs > dt {
			f := 1 - dt/secs
			b, ba = b*f, ba*f
		} else {
			b, ba = 0, 0
		}
	}
	return min(max(b, 0), float64(w.prefillTokens)), min(max(ba, 0), w.prefillAttn)
}

// churnHalfLife is how fast a worker's churn forgets: about the time a
// busy worker's cache takes to turn over.
const churnHalfLife = 60 * time.Second

// churnFactorLocked turns the workers' churn weights into tokens at now.
func (p *Pool) churnFactorLocked(now time.Time) float64 {
	return math.Exp2(-now.Sub(p.churnEpoch).Seconds() / churnHalfLife.Seconds())
}

// churnMaxExponent bounds the weights' exponent before a rebase: 2^500
// leaves float64 room to add tokens, and it is about eight hours.
const churnMaxExponent = 500

// addChurnLocked counts tokens routed to w at now. Guarded by p.mu
// (write).
func (p *Pool) addChurnLocked(w *worker, tokens int, now time.Time) {
	if p.churnEpoch.IsZero() {
		p.churnEpoch = now
	}
	e := now.Sub(p.churnEpoch).Seconds() / churnHalfLife.Seconds()
	if e > churnMaxExponent {
		f := math.Exp2(-e)
		for _, o := range p.workers {
			o.churn *= f
		}
		p.churnEpoch, e = now, 0
		p.summarizeAllLocked()
	}
	w.churn += float64(tokens) * math.Exp2(e)
}

// settleBacklogLocked brings w's backlog model to now, before a change.
func (p *Pool) settleBacklogLocked(w *worker, now time.Time) {
	rate, overhead, context, n := p.blendedFitLocked(w)
	pass := p.blendPassLocked(w.fit.pass, fitShare(n))
	w.backlog, w.backlogAttn = w.backlogNow(now, rate, overhead, context, pass, p.opts.NoPrefillDecay)
	w.backlogAt = now
}

// Fits returns every worker's learned prefill model, sorted by worker.
func (p *Pool) Fits() []RateFit {
	p.mu.RLock()
	out := make([]RateFit, 0, len(p.workers))
	for id, w := range p.workers {
		rate, overhead, context, n := p.blendedFitLocked(w)
		pass := p.blendPassLocked(w.fit.pass, fitShare(n))
		out = append(out, RateFit{Worker: id, PrefillRate: rate, OverheadSeconds: overhead, ContextSeconds: context, PassSeconds: pass, Samples: n})
	}
	p.mu.RUnlock()
	slices.SortFunc(out, func(a, b RateFit) int { return strings.Compare(a.Worker, b.Worker) })
	return out
}

// appendLoads appends the loads of the known candidates, skipping IDs the
// pool does not hold. It builds each Load in place: this is the hot loop
// of every pick. With pending set, each candidate's overlap extends over
// the req's blocks pending on the worker (the pending overlay).
func (p *Pool) appendLoads(dst []Load, req *Request, cands []Candidate, pending bool) []Load {
	now := p.opts.Now()
	nowNs := now.UnixNano()
	p.mu.RLock()
	churn := p.churnFactorLocked(now)
	for i := range cands {
		c := &cands[i]
		w := p.resolveLocked(c)
		if w == nil {
			continue
		}
		dst = append(dst, w.static)
		p.fillCandidateLocked(&dst[len(dst)-1], w, c, i, req, pending, now, nowNs, churn)
	}
	p.mu.RUnlock()
	return dst
}

// resolveLocked returns c's worker, or nil when the pool does not hold it.
func (p *Pool) resolveLocked(c *Candidate) *worker {
	w := c.w
	if w == nil || w.removed || w.spec.ID != c.Worker {
		w = p.workers[c.Worker]
	}
	return w
}

// fillCandidateLocked sets l, which holds w.static, to candidate i's Load
// at now (churn is churnFactorLocked(now)): w's live load and c's overlap,
// extended by the pending overlay when pending is set.
func (p *Pool) fillCandidateLocked(l *Load, w *worker, c *Candidate, i int, req *Request, pending bool, now time.Time, nowNs int64, churn float64) {
	p.fillLoadLocked(l, w, now, churn)
	l.MatchedBlocks, l.CachedBlocks, l.index = c.MatchedBlocks, c.CachedBlocks, i
	l.HostBlocks, l.DiskBlocks, l.PendingBlocks, l.ForecastLostBlocks = c.HostBlocks, c.DiskBlocks, 0, 0
	if lost := p.forecastLossLocked(w, req.Hashes, c.MatchedBlocks); lost > 0 && !c.Stale {
		l.forecastLoss(lost)
	} else if pending && !c.Stale {
		l.addPending(w.pending.run(req.Hashes, c.MatchedBlocks, nowNs))
	}
}

// Snapshot returns every worker's load, sorted by ID, for debug endpoints
// and gauges.
func (p *Pool) Snapshot() []Load {
	now := p.opts.Now()
	p.mu.RLock()
	out := make([]Load, 0, len(p.workers))
	for _, w := range p.workers {
		out = append(out, p.loadLocked(w, now))
	}
	p.mu.RUnlock()
	slices.SortFunc(out, func(a, b Load) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// Load returns one worker's load.
func (p *Pool) Load(id string) (Load, bool) {
	now := p.opts.Now()
	p.mu.RLock()
	defer p.mu.RUnlock()
	w, ok := p.workers[id]
	if !ok {
		return Load{}, false
	}
	return p.loadLocked(w, now), true
}

func (p *Pool) capacityChanged() {
	if f := p.onCapacity.Load(); f != nil {
		(*f)()
	}
}

func (p *Pool) setCapacityListener(f func()) { p.onCapacity.Store(&f) }

// minUncached is the request's fewest uncached tokens over the known
// candidates: what it would cost to prefill on its best worker.
func (p *Pool) minUncached(req *Request, cands []Candidate) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	best := req.PromptTokens
	for _, c := range cands {
		if w := p.workers[c.Worker]; w != nil {
			best = min(best, max(req.PromptTokens-c.MatchedBlocks*w.spec.BlockSize, 0))
		}
	}
	return best
}
