package scoring

import (
	"fmt"
	"sync"
	"time"
)

// A kv decision at temperature 0 without a Load for every candidate.
//
// The full decision (Scheduler.decideFull) builds every candidate's Load
// (a few hundred bytes: live load, report freshness, learned prefill
// model, backlog, pending overlay), prices them all and scans for the
// lowest logit. decidePruned makes the same decision in two passes. The
// first reads each candidate's live load into one scratch Load, from the
// worker's summary (summary.go) rather than the worker, and keeps,
// in a small record, its health tier and what the cost model prices of it
// alone (loadParts); it sums each tier's aggregates on the way (the
// longest held prefix, the churn, the longest queue: fleetStats), in
// candidate order, as the full decision sums its best tier. The second
// runs selectLogit's scan over the best tier's records in candidate order,
// completing each price against the aggregates (finish). Three things
// keep that cheap and exact:
//
//   - A record's floor never exceeds its price; a candidate whose floor is
//     beyond the best so far by more than the tie tolerance is one the scan
//     passes over whatever its price, so it is not finished.
//   - The first pass leaves out the backlog of a worker with prefill in
//     flight (modelling its drain is a good part of building a Load): a
//     price never falls as the backlog grows, so such a record's price is a
//     lower bound, and the candidate is priced from a full Load only when
//     that bound does not rule it out.
//   - Every other record's price is the full decision's to the bit: the
//     cost models price in the same two steps (parts, finish) on both
//     paths, from the same fields.
//
// The scan's state, its random draws for ties included, is therefore the
// full decision's step by step, and so is the pick. Temperature sampling
// weighs every candidate, so it, and an explanation, take the full
// decision.

// fleetStats aggregates one decision's candidates, in order, for the cost
// models' terms that compare a candidate with the others.
type fleetStats struct {
	n        int
	held     int     // the longest prefix any candidate holds, tokens
	churnSum float64 // the candidates' Load.Churn
	// maxWaiting is the longest queue (Load.Waiting).
	maxWaiting int
}

func (s *fleetStats) add(req *Request, l *Load) {
	s.n++
	s.held = max(s.held, heldTokens(req, l))
	s.churnSum += l.Churn
	s.maxWaiting = max(s.maxWaiting, l.Waiting())
}

// fleetView is what a cost model compares each candidate against: the
// longest prefix (tokens) any candidate holds, for the latency cost's
// duplicate-prefill and slowdown terms, the candidates' mean churn, for
// its churn term, and the longest queue, for the weighted cost.
type fleetView struct {
	held       int
	meanChurn  float64
	maxWaiting int
}

// loadParts is a candidate's price before the view: what a cost model's
// parts computes and its finish completes. Each model uses its own fields.
type loadParts struct {
	// base is the latency cost's predicted TTFT, the default cost's
	// logit, the weighted cost's a·ratio − b·usage.
	base float64
	// floor is at most finish's result for every view, to the bit: what
	// the view adds is never negative.
	floor float64
	// The latency cost's other parts (see latencyCost.parts).
	rate, context, decodeKV, slowdown, fixed, memory, churn float64
	held                                                    int
	// waiting is the weighted cost's queue (Load.Waiting).
	waiting int
}

// pruneRecord is what the first pass keeps of a candidate.
type pruneRecord struct {
	parts loadParts
	// index is the candidate's in the caller's slice.
	index                int32
	matched, pends, lost int32
	// cached is the candidate's CachedBlocks, the scan's tie-break.
	cached int
	tier   tier
	// exact is set when parts were priced with the worker's backlog;
	// otherwise with none, so finish gives a lower bound on the logit.
	exact bool
}

// pruneAt is the fewest candidates for which decide prunes: below it the
// full decision is as cheap (BenchmarkPick: even at 64 workers).
const pruneAt = 128

// prunable reports whether decide may take decidePruned for the mode: at
// temperature 0 without an explanation.
func (m *KV) prunable(exp *Explanation) bool { return exp == nil && m.temperature == 0 }

// pruneScratch is one decision's memory: the records, and the Loads the
// cost model reads through its interface (on the stack they would escape).
type pruneScratch struct {
	recs   []pruneRecord
	tmp, l Load
}

var pruneScratches = sync.Pool{New: func() any { return &pruneScratch{recs: make([]pruneRecord, 0, 64)} }}

// decidePruned is Scheduler.decide for the kv mode m at temperature 0 (see
// the top of this file): the same decision, the same random draws.
func (p *Pool) decidePruned(req *Request, cands []Candidate, pending bool, m *KV, threshold float64) (d Decision, saturated bool, err error) {
	sc := pruneScratches.Get().(*pruneScratch)
	if cap(sc.recs) < len(cands) {
		sc.recs = make([]pruneRecord, 0, len(cands))
	}
	recs, tmp, l := sc.recs[:0], &sc.tmp, &sc.l
	defer func() {
		sc.recs = recs[:0]
		pruneScratches.Put(sc)
	}()
	now := p.opts.Now()
	nowNs := now.UnixNano()
	p.mu.RLock()
	defer p.mu.RUnlock()
	churn := p.churnFactorLocked(now)

	// First pass: every candidate's tier, the aggregates of each tier (the
	// full decision keeps only the best tier present, in order) and parts.
	var (
		stats [tierEjected + 1]fleetStats
		busy  = [tierEjected + 1]bool{true, true, true, true} // every candidate saturated
		best  = tierEjected
	)
	// The summaries hold what fillLiveLocked reads, except with
	// NoPrefillDecay (every backlog is then the prefill tokens' own).
	useSums := !p.opts.NoPrefillDecay
	sinceEpoch := int64(now.Sub(p.epoch))
	for i := range cands {
		c := &cands[i]
		var exact bool
		if s := c.s; useSums && s != nil && s.flags&sumSlow == 0 && s.healthUntil <= sinceEpoch && s.id == c.Worker {
			// c.w is s's worker: both were set when the arrays were
			// last built, and nothing was removed since.
			exact = p.fillSummaryLocked(tmp, s, sinceEpoch, churn)
			tmp.MatchedBlocks, tmp.CachedBlocks, tmp.HostBlocks, tmp.DiskBlocks, tmp.PendingBlocks, tmp.ForecastLostBlocks = c.MatchedBlocks, c.CachedBlocks, c.HostBlocks, c.DiskBlocks, 0, 0
			// The overlay counts from the first block past the match; a
			// worker none of whose entries can be that block has none.
			if lost := p.forecastLossLocked(c.w, req.Hashes, c.MatchedBlocks); lost > 0 && !c.Stale {
				tmp.forecastLoss(lost)
			} else if from := max(c.MatchedBlocks, 0); pending && !c.Stale && s.flags&sumPending != 0 && from < len(req.Hashes) && mayHold(&s.pendingBits, req.Hashes[from]) {
				tmp.addPending(c.w.pending.run(req.Hashes, c.MatchedBlocks, nowNs))
			}
		} else {
			w := p.resolveLocked(c)
			if w == nil {
				continue
			}
			exact = p.fillLiveLocked(tmp, w, now, churn)
			tmp.MatchedBlocks, tmp.CachedBlocks, tmp.HostBlocks, tmp.DiskBlocks, tmp.PendingBlocks, tmp.ForecastLostBlocks = c.MatchedBlocks, c.CachedBlocks, c.HostBlocks, c.DiskBlocks, 0, 0
			if lost := p.forecastLossLocked(w, req.Hashes, c.MatchedBlocks); lost > 0 && !c.Stale {
				tmp.forecastLoss(lost)
			} else if pending && !c.Stale {
				tmp.addPending(w.pending.run(req.Hashes, c.MatchedBlocks, nowNs))
			}
		}
		t := tmp.tier()
		best = min(best, t)
		stats[t].add(req, tmp)
		if threshold > 0 {
			busy[t] = busy[t] && tmp.saturated(threshold)
		}
		// Set field by field: zeroing a record first costs as much again.
		recs = recs[:len(recs)+1]
		rec := &recs[len(recs)-1]
		rec.index, rec.matched, rec.pends, rec.lost, rec.tier, rec.exact, rec.cached = int32(i), int32(tmp.MatchedBlocks), int32(tmp.PendingBlocks), int32(tmp.ForecastLostBlocks), t, exact, c.CachedBlocks
		m.cost.parts(req, tmp, &rec.parts)
	}
	if len(recs) == 0 {
		return Decision{}, false, fmt.Errorf("pick for model %q among %d candidates: %w", req.Model, len(cands), ErrNoWorkers)
	}
	if threshold > 0 && busy[best] {
		return Decision{}, true, nil
	}

	// Second pass: selectLogit's scan over the best tier. A candidate
	// priced with its backlog takes the scan's step as is; one priced
	// without is passed over when even that is beyond the best so far by
	// more than the tie tolerance, and is priced again with its backlog
	// otherwise.
	v := m.cost.view(stats[best])
	var (
		s      lowest
		chosen = -1
		k      int // position among the best tier's candidates
	)
	for j := range recs {
		rec := &recs[j]
		if rec.tier != best {
			continue
		}
		if stats[best].n == 1 {
			// selectLogit returns the only candidate without pricing it.
			chosen = j
			break
		}
		if k > 0 && rec.parts.floor-s.logit > s.tol {
			// Passed over whatever the view adds (and the backlog, if
			// the parts were priced without it).
			k++
			continue
		}
		logit := m.cost.finish(&rec.parts, v)
		if !rec.exact {
			if k > 0 && logit-s.logit > s.tol {
				k++
				continue
			}
			c := &cands[rec.index]
			w := p.resolveLocked(c)
			*l = w.static
			p.fillCandidateLocked(l, w, c, int(rec.index), req, pending, now, nowNs, churn)
			logit = m.cost.logit(req, l, v)
		}
		if k == 0 {
			s.first(k, logit, rec.cached)
			chosen = j
		} else {
			prev := s.best
			s.consider(k, logit, rec.cached, m.rand)
			if s.best != prev {
				chosen = j
			}
		}
		k++
	}
	rec := &recs[chosen]
	w := p.resolveLocked(&cands[rec.index])
	return Decision{Worker: w.static.ID, Cluster: w.static.Cluster, Address: w.static.Address, Index: int(rec.index),
		MatchedBlocks: int(rec.matched), PendingBlocks: int(rec.pends), ForecastLostBlocks: int(rec.lost)}, false, nil
}

// fillLiveLocked sets what a cost model, the tier, the aggregates and the
// saturation test read of l from w at now, as fillLoadLocked does, and
// reports whether that includes the backlog. A worker with prefill work
// in flight gets none: modelling its drain is a good part of building a
// Load, and without it the logit is a lower bound. churn is
// churnFactorLocked(now).
func (p *Pool) fillLiveLocked(l *Load, w *worker, now time.Time, churn float64) (exact bool) {
	fresh := w.hasReport && now.Sub(w.reportAt) <= p.opts.StaleReportAge
	l.BlockSize, l.KVTotalBlocks, l.MaxNumBatchedTokens = w.blockSize, w.kvTotalBlocks, w.maxBatched
	l.ActiveBlocks = w.activeBlocks()
	l.ActiveRequests = w.requests
	l.PrefillTokens = w.prefillTokens
	l.PrefillRequests = w.prefillRequests
	l.Report = w.report
	l.ReportFresh = fresh
	l.ReportIdle = fresh && w.report.Running == 0 && w.report.Waiting == 0 && w.reportAdds == w.adds
	l.ReportSilent = w.hasReport && !fresh
	// A zero time is never after now: most workers were never ejected.
	l.Ejected = !w.health.ejectedUntil.IsZero() && w.health.ejectedUntil.After(now)
	l.Cooling = !w.health.coolUntil.IsZero() && w.health.coolUntil.After(now)
	var n int
	l.PrefillRate, l.PrefillOverhead, l.PrefillContext, n = p.blendedFitLocked(w)
	l.PrefillPass = p.blendPassLocked(w.fit.pass, fitShare(n))
	l.Churn = w.churn * churn
	l.PrefillBacklog, l.PrefillBacklogAttention = 0, 0
	if w.backlog > 0 && w.prefillTokens > 0 && !p.opts.NoPrefillDecay {
		return false
	}
	// Exact, and cheap: backlogNow skips the clock for a worker with no
	// backlog, and the decay with NoPrefillDecay.
	l.PrefillBacklog, l.PrefillBacklogAttention = w.backlogNow(now, l.PrefillRate, l.PrefillOverhead, l.PrefillContext, l.PrefillPass, p.opts.NoPrefillDecay)
	return true
}
