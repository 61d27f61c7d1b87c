package scoring

// dynamoCost is CostDefault, Dynamo's form, in KV blocks
// (docs/architecture.md §3.7):
//
//	logit   = scale × max(prefill − credit, 0) + decode
//	prefill = (backlog + prompt tokens) ÷ block size
//	credit  = overlap_credit × device blocks matched
//	        + host_weight × host blocks + disk_weight × disk blocks
//	decode  = the worker's KV blocks in use (Load.KVUsedBlocks)
//	        + this request's blocks (prompt + expected output)
//	        + request_weight × active requests
//
// where backlog is the worker's modelled prefill work still ahead
// (Load.PrefillBacklog; left out with NoTrackPrefillTokens). With credit 1
// it is the old overlap_weight × (backlog + uncached) + decode, scale
// playing the weight.
type dynamoCost struct {
	credit, scale, hostW, diskW, reqW float64
	trackPrefill                      bool
}

func (*dynamoCost) name() string { return CostDefault }

func (*dynamoCost) view(fleetStats) fleetView { return fleetView{} }

// parts is the logit itself: the cost compares a candidate with no other.
func (c *dynamoCost) parts(req *Request, l *Load, p *loadParts) {
	p.base = c.termsOf(req, l).logit
	p.floor = p.base
}

func (*dynamoCost) finish(p *loadParts, _ fleetView) float64 { return p.base }

func (c *dynamoCost) logit(req *Request, l *Load, _ fleetView) float64 {
	return c.termsOf(req, l).logit
}

func (c *dynamoCost) explain(req *Request, loads []Load, exp *Explanation, terms []Terms) {
	exp.OverlapCredit, exp.PrefillLoadScale = c.credit, c.scale
	for i := range loads {
		d := c.termsOf(req, &loads[i])
		terms[i].PrefillLoadScale, terms[i].PrefillBlocks, terms[i].DecodeBlocks = c.scale, d.prefill, d.decode
	}
}

type defaultTerms struct{ prefill, decode, logit float64 }

func (c *dynamoCost) termsOf(req *Request, l *Load) defaultTerms {
	bs := float64(l.BlockSize)
	raw := float64(req.PromptTokens)
	if c.trackPrefill {
		raw += l.PrefillBacklog
	}
	credit := c.credit*float64(l.MatchedBlocks) + c.hostW*float64(l.HostBlocks) + c.diskW*float64(l.DiskBlocks)
	prefill := max(raw/bs-credit, 0)
	decode := float64(l.KVUsedBlocks()+blocksFor(req.PromptTokens+req.ExpectedOutputTokens, l.BlockSize)) +
		c.reqW*float64(l.ActiveRequests)
	return defaultTerms{prefill: prefill, decode: decode, logit: c.scale*prefill + decode}
}
