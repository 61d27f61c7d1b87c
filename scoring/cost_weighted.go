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

func (c *weightedCost) price(req *Request, loads []Load) {
	mw := maxWaiting(loads)
	for i := range loads {
		loads[i].logit = -c.termsOf(req, &loads[i], mw).score
	}
}

func (c *weightedCost) explain(req *Request, loads []Load, exp *Explanation, terms []Terms) {
	exp.Coefficients = &WeightedCoefficients{A: c.a, B: c.b, C: c.c}
	mw := maxWaiting(loads)
	for i := range loads {
		w := c.termsOf(req, &loads[i], mw)
		t := &terms[i]
		t.Score, t.OverlapRatio, t.KVUsage, t.NormalizedWaiting = w.score, w.ratio, w.usage, w.waiting
	}
}

// maxWaiting is the largest waiting count among the candidates.
func maxWaiting(loads []Load) int {
	n := 0
	for i := range loads {
		n = max(n, loads[i].Waiting())
	}
	return n
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
