package scoring

// weightedCost is CostWeighted, higher better and used as −score:
//
//	score = a·overlap_ratio − b·kv_usage − c·normalized_waiting
//
// where overlap_ratio = matched tokens ÷ prompt tokens, kv_usage = KV blocks
// in use ÷ capacity and normalized_waiting = Load.Waiting ÷ the largest
// waiting count among the candidates.
type weightedCost struct {
	a, b, c float64
}

func (*weightedCost) name() string { return CostWeighted }

func (*weightedCost) view(s *fleetStats) fleetView { return fleetView{maxWaiting: s.maxWaiting} }

func (c *weightedCost) logit(req *Request, l *Load, v fleetView) float64 {
	return -c.termsOf(req, l, v.maxWaiting).score
}

func (c *weightedCost) explain(req *Request, loads []Load, exp *Explanation, terms []Terms) {
	exp.Coefficients = &WeightedCoefficients{A: c.a, B: c.b, C: c.c}
	var s fleetStats
	for i := range loads {
		s.add(req, &loads[i])
	}
	mw := s.maxWaiting
	for i := range loads {
		w := c.termsOf(req, &loads[i], mw)
		t := &terms[i]
		t.Score, t.OverlapRatio, t.KVUsage, t.NormalizedWaiting = w.score, w.ratio, w.usage, w.waiting
	}
}

// bound is the logit in parts: the overlap and usage terms, and the
// waiting term times the candidates' longest queue.
func (c *weightedCost) bound(req *Request, l *Load, b *loadBound) {
	t := c.termsOf(req, l, 0)
	b.base, b.waiting, b.magnitude = -t.score, c.c*float64(l.Waiting()), c.a*t.ratio+c.b*t.usage+c.c
}

type weightedTerms struct{ ratio, usage, waiting, score float64 }

func (c *weightedCost) termsOf(req *Request, l *Load, maxWaiting int) weightedTerms {
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
	t.score = c.a*t.ratio - c.b*t.usage - c.c*t.waiting
	return t
}
