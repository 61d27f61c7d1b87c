package scoring

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// Worker summaries: what decidePruned's first pass reads of each worker,
// in one contiguous array per model.
//
// A worker struct is about a thousand bytes; the fields a kv decision
// reads of it span six cache lines, and between decisions of a busy
// router they are rarely still in cache. A summary holds the same values
// in 152 bytes, laid out in the model's candidate order, so the first
// pass reads 1,000 workers as two sequential streams (the candidates and
// their summaries) instead of 1,000 scattered structs.
//
// A summary is a copy, kept by the pool: every change to what it holds
// (a request added, moved, freed or past its first token, a load report,
// an ejection or a cooldown, a learned prefill rate, the pending overlay,
// the churn) happens under the pool's write lock, and the code that
// releases that lock after changing a worker calls summarizeLocked for
// it. Times are held as nanoseconds since Pool.epoch, which compare as
// the times do: they all come from the pool's clock, so time.Time.Sub
// and After agree on them. What does not fit, or is rare enough not to
// deserve room (a count past int32, a block size past uint16, a backlog
// without prefill tokens), marks the summary slow, and the first pass
// reads that worker itself, as it does for a worker that is ejected or
// cooling and for a candidate without a summary (built by hand, or from
// before the pool's workers changed: rebuilding the arrays marks every
// old summary slow).
// TestSummariesAreCurrent and the pruned decision's differential tests
// hold the copies to the workers.

// workerSummary is one worker's summary (see the top of this file).
type workerSummary struct {
	// id is the worker's ID, for the candidate's check.
	id string
	// reportAt is since Pool.epoch, in ns, and healthUntil the later of
	// the ejection's and the cooldown's ends (math.MinInt64 for neither):
	// while it is after now the first pass reads the worker, which says
	// which of the two it is.
	reportAt, healthUntil int64
	// churn is worker.churn (times churnFactorLocked at a decision).
	churn float64
	// The worker's own prefill fit and the share it has in the blend
	// with the fleet's (see blendFitLocked).
	fitRate, fitOverhead, fitContext, fitPass, fitShare float64
	// pendingBits is the pending overlay's filter (pendingBlocks.bits):
	// a hash it does not hold is not pending, and the first pass skips
	// that worker's overlay.
	pendingBits                                            [4]uint64
	kvTotalBlocks, maxBatched                              int32
	activeBlocks, requests, prefillTokens, prefillRequests int32
	// The latest load report's fields that a decision reads.
	reportWaiting, reportKVUsed, reportKVTotal int32
	blockSize                                  uint16
	flags                                      summaryFlags
}

type summaryFlags uint8

const (
	// sumReport: the worker sent a load report.
	sumReport summaryFlags = 1 << iota
	// sumIdleReport: the report shows nothing running or waiting, and no
	// request was added since (Load.ReportIdle when fresh).
	sumIdleReport
	// sumBacklog: prefill in flight with a modelled backlog: the first
	// pass prices it without (see fillLiveLocked).
	sumBacklog
	// sumPending: the worker has pending overlay entries.
	sumPending
	// sumSlow: read the worker instead.
	sumSlow
)

// nsSince is t − epoch in ns, or math.MinInt64 for the zero time.
func nsSince(t, epoch time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	return int64(t.Sub(epoch))
}

// fits32 reports whether every value fits an int32.
func fits32(vs ...int) bool {
	for _, v := range vs {
		if v != int(int32(v)) {
			return false
		}
	}
	return true
}

// summarizeLocked brings w's summaries up to date. Guarded by p.mu
// (write).
func (p *Pool) summarizeLocked(w *worker) {
	if len(w.sums) == 0 {
		return
	}
	s := p.summaryOfLocked(w)
	for _, slot := range w.sums {
		*slot = s
	}
}

// summaryOfLocked is w's summary now.
func (p *Pool) summaryOfLocked(w *worker) (s workerSummary) {
	active := w.activeBlocks()
	switch {
	case !fits32(w.kvTotalBlocks, w.maxBatched, active, w.requests, w.prefillTokens, w.prefillRequests,
		w.report.Waiting, w.report.KVUsedBlocks, w.report.KVTotalBlocks),
		w.blockSize != int(uint16(w.blockSize)),
		w.backlog > 0 && w.prefillTokens <= 0:
		s = workerSummary{flags: sumSlow}
	default:
		s = workerSummary{
			id:          w.spec.ID,
			reportAt:    nsSince(w.reportAt, p.epoch),
			healthUntil: max(nsSince(w.health.ejectedUntil, p.epoch), nsSince(w.health.coolUntil, p.epoch)),
			churn:       w.churn,
			fitRate:     w.fit.rate, fitOverhead: w.fit.overhead, fitContext: w.fit.context, fitPass: w.fit.pass, fitShare: fitShare(w.fit.samples),
			blockSize: uint16(w.blockSize), kvTotalBlocks: int32(w.kvTotalBlocks), maxBatched: int32(w.maxBatched),
			activeBlocks: int32(active), requests: int32(w.requests),
			prefillTokens: int32(w.prefillTokens), prefillRequests: int32(w.prefillRequests),
			reportWaiting: int32(w.report.Waiting), reportKVUsed: int32(w.report.KVUsedBlocks), reportKVTotal: int32(w.report.KVTotalBlocks),
		}
		if w.hasReport {
			s.flags |= sumReport
		}
		if w.report.Running == 0 && w.report.Waiting == 0 && w.reportAdds == w.adds {
			s.flags |= sumIdleReport
		}
		if w.backlog > 0 && w.prefillTokens > 0 {
			s.flags |= sumBacklog
		}
		if w.pending.live > 0 {
			s.flags |= sumPending
			s.pendingBits = w.pending.bits
		}
	}
	return s
}

// summarizeAllLocked brings every worker's summaries up to date, after a
// change that may touch any of them.
func (p *Pool) summarizeAllLocked() {
	for _, w := range p.workers {
		p.summarizeLocked(w)
	}
}

// fillSummaryLocked is fillLiveLocked from w's summary s: the same fields
// to the bit, at nowNs (now − Pool.epoch). It needs opts.NoPrefillDecay
// unset (with it every backlog would need the worker) and s.healthUntil
// not after now.
func (p *Pool) fillSummaryLocked(l *Load, s *workerSummary, nowNs int64, churn float64) (exact bool) {
	hasReport := s.flags&sumReport != 0
	fresh := hasReport && nowNs-s.reportAt <= int64(p.opts.StaleReportAge)
	l.BlockSize, l.KVTotalBlocks, l.MaxNumBatchedTokens = int(s.blockSize), int(s.kvTotalBlocks), int(s.maxBatched)
	l.ActiveBlocks = int(s.activeBlocks)
	l.ActiveRequests = int(s.requests)
	l.PrefillTokens = int(s.prefillTokens)
	l.PrefillRequests = int(s.prefillRequests)
	// The report's other fields are read by nothing a kv decision prices.
	l.Report = fleet.LoadReport{Waiting: int(s.reportWaiting), KVUsedBlocks: int(s.reportKVUsed), KVTotalBlocks: int(s.reportKVTotal)}
	l.ReportFresh = fresh
	l.ReportIdle = fresh && s.flags&sumIdleReport != 0
	l.ReportSilent = hasReport && !fresh
	l.Ejected, l.Cooling = false, false // s.healthUntil is not after now
	l.PrefillRate, l.PrefillOverhead, l.PrefillContext = p.blendShareLocked(s.fitRate, s.fitOverhead, s.fitContext, s.fitShare)
	l.PrefillPass = p.blendPassLocked(s.fitPass, s.fitShare)
	l.Churn = s.churn * churn
	l.PrefillBacklog, l.PrefillBacklogAttention = 0, 0
	return s.flags&sumBacklog == 0
}

// rebuildSummariesLocked lays out one summary array per model in
// candidate order and points each worker and candidate at its slots. The
// old arrays, which candidates gathered before may still point into,
// are marked slow: nothing updates them any more.
func (p *Pool) rebuildSummariesLocked() {
	for _, old := range p.sums {
		for i := range old {
			old[i] = workerSummary{flags: sumSlow}
		}
	}
	clear(p.sums)
	for _, w := range p.workers {
		w.sums = w.sums[:0]
	}
	for name, ws := range p.models {
		arr := make([]workerSummary, len(ws))
		cs := p.candidates[name]
		for i, w := range ws {
			w.sums = append(w.sums, &arr[i])
			cs[i].s = &arr[i]
		}
		p.sums[name] = arr
	}
	p.summarizeAllLocked()
}
