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

func (*weightedCost) view(s fleetStats) fleetView { return fleetView{maxWaiting: s.maxWaiting} }

// parts is the score's overlap and usage terms (base) and the worker's
// queue (waiting), which finish normalizes by the longest.
func (c *weightedCost) parts(req *Request, l *Load, p *loadParts) {
	r, u := c.ratioUsage(req, l)
	p.base, p.waiting = c.a*r-c.b*u, l.Waiting()
	p.floor = -p.base // the waiting term only lowers the score
}

func (c *weightedCost) logit(req *Request, l *Load, v fleetView) float64 {
	return -c.termsOf(req, l, v.maxWaiting).score
}

func (c *weightedCost) finish(p *loadParts, v fleetView) float64 {
	return -c.score(p.base, p.waiting, v.maxWaiting)
}

// score subtracts the normalized waiting term from base, a·ratio − b·usage.
func (c *weightedCost) score(base float64, waiting, maxWaiting int) float64 {
	w := 0.0
	if maxWaiting > 0 {
		w = float64(waiting) / float64(maxWaiting)
	}
	return base - c.c*w
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

type weightedTerms struct{ ratio, usage, waiting, score float64 }

func (c *weightedCost) termsOf(req *Request, l *Load, maxWaiting int) weightedTerms {
	var t weightedTerms
	t.ratio, t.usage = c.ratioUsage(req, l)
	if maxWaiting > 0 {
		t.waiting = float64(l.Waiting()) / float64(maxWaiting)
	}
	t.score = c.score(c.a*t.ratio-c.b*t.usage, l.Waiting(), maxWaiting)
	return t
}

// ratioUsage is the overlap ratio (matched tokens ÷ prompt tokens) and the
// KV usage (blocks in use ÷ capacity), each at most 1.
func (c *weightedCost) ratioUsage(req *Request, l *Load) (ratio, usage float64) {
	if req.PromptTokens > 0 {
		ratio = min(float64(l.MatchedBlocks*l.BlockSize)/float64(req.PromptTokens), 1)
	}
	capacity := l.KVTotalBlocks
	if l.ReportFresh && l.Report.KVTotalBlocks > 0 {
		capacity = l.Report.KVTotalBlocks
	}
	if capacity > 0 {
		usage = min(float64(l.KVUsedBlocks())/float64(capacity), 1)
	}
	return ratio, usage
}
