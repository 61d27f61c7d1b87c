package scoring

import "math"

// latencyCost is CostLatency, in seconds of predicted time to first token
// plus what routing there costs the fleet:
//
//	logit    = overhead + (backlog + uncached) ÷ rate
//	         + context × (backlog attention + uncached × (cached + uncached ÷ 2))
//	         + decode KV cost × passes × KV tokens in use
//	         + pass × passes, when other requests are active on the worker
//	         + slowdown_weight × active requests × duplicated ÷ rate
//	         + request_weight × active requests × block size ÷ rate
//	         + the time to recompute what the request would preempt
//	         + duplicate_weight × (longest prefix another candidate holds
//	           − this one's) ÷ rate
//	         + churn_weight × uncached ÷ rate × churn ÷ the candidates' mean churn
//
// with the worker's learned prefill rate, overhead and context cost
// (Load.PrefillRate, Load.PrefillOverhead, Load.PrefillContext: seconds
// per token pair, what each new token spends attending to the cached
// prefix and the tokens before it), passes = ⌈(backlog + uncached) ÷
// max_num_batched_tokens⌉ (each pass until the first token also decodes
// every request running on the worker, reading its KV cache: see
// Options.DecodeKVCost; pass is the learned Load.PrefillPass, what such a
// shared pass costs beyond that), uncached = prompt tokens not held on
// the device (host and disk blocks count at 1 − their weight), and
// preemption charged when the request's blocks exceed the worker's free
// KV, and churn the uncached tokens the worker took lately (Load.Churn):
// sending what evicts where the cache turned over least keeps every
// worker's cache as long-lived as the fleet allows.
type latencyCost struct {
	hostW, diskW, reqW, slowdown, duplicate, churn, decodeKV float64
	trackPrefill                                             bool
}

func (*latencyCost) name() string { return CostLatency }

func (c *latencyCost) explain(req *Request, loads []Load, _ *Explanation, terms []Terms) {
	var s fleetStats
	for i := range loads {
		s.add(req, &loads[i])
	}
	fleet := c.view(s)
	for i := range loads {
		lt := c.termsOf(req, &loads[i], fleet)
		t := &terms[i]
		t.DecodeKVSeconds = lt.decodeKV
		t.PredictedTTFT, t.ContextSeconds, t.DecodeSlowdown, t.MemoryPenalty, t.DuplicatePrefill, t.CacheChurn = lt.ttft, lt.context, lt.slowdown, lt.memory, lt.duplicate, lt.churn
	}
}

// latencyTerms are the latency cost's parts in seconds; ttft includes
// context, the part spent attending to context, and decodeKV, the part
// spent decoding the worker's running requests beside the prefill.
type latencyTerms struct{ ttft, context, decodeKV, slowdown, memory, duplicate, churn, logit float64 }

// decodeKVWork is the KV tokens that the decode steps beside a prefill
// read before its first token: one pass per max_num_batched_tokens of the
// prefill work ahead of that token (the backlog and the request's own
// uncached tokens), each reading the kvTokens in use on the worker.
func decodeKVWork(prefillTokens float64, kvTokens, maxBatched int) float64 {
	if !(prefillTokens > 0) || kvTokens <= 0 {
		return 0
	}
	if maxBatched <= 0 {
		maxBatched = DefaultMaxNumBatchedTokens
	}
	return math.Ceil(prefillTokens/float64(maxBatched)) * float64(kvTokens)
}

// heldTokens is how much of the prompt, in tokens, l's worker holds on its
// device or is computing.
func heldTokens(req *Request, l *Load) int {
	return min(l.MatchedBlocks*l.BlockSize, req.PromptTokens)
}

// view takes the longest prefix any candidate holds when the duplicate or
// slowdown term needs it, and the candidates' mean churn when the churn
// term does.
func (c *latencyCost) view(s fleetStats) fleetView {
	var v fleetView
	if c.duplicate > 0 || c.slowdown > 0 {
		v.held = s.held
	}
	if c.churn > 0 && s.n > 0 {
		v.meanChurn = s.churnSum / float64(s.n)
	}
	return v
}

// termsOf predicts a candidate's cost against the fleet's view. It is one
// function, which the full decision calls per candidate; parts and finish
// compute the same terms in two steps, with the same operations in the
// same order, for decidePruned (TestPartsThenFinishIsTheLogit holds them
// to the bit).
func (c *latencyCost) termsOf(req *Request, l *Load, fleet fleetView) latencyTerms {
	bs := float64(l.BlockSize)
	rate := l.PrefillRate
	if !(rate > 0) {
		rate = DefaultPrefillRate
	}
	held := float64(l.MatchedBlocks) + c.hostW*float64(l.HostBlocks) + c.diskW*float64(l.DiskBlocks)
	uncached := max(float64(req.PromptTokens)-held*bs, 0)
	var t latencyTerms
	backlog, backlogAttn := 0.0, 0.0
	if c.trackPrefill {
		backlog, backlogAttn = l.PrefillBacklog, l.PrefillBacklogAttention
	}
	cached := float64(req.PromptTokens) - uncached
	t.context = l.PrefillContext * (backlogAttn + uncached*(cached+uncached/2))
	t.decodeKV = c.decodeKV*decodeKVWork(backlog+uncached, l.KVUsedBlocks()*l.BlockSize, l.MaxNumBatchedTokens) +
		l.PrefillPass*sharedPasses(backlog+uncached, l.ActiveRequests, l.MaxNumBatchedTokens)
	t.ttft = l.PrefillOverhead + (backlog+uncached)/rate + t.context + t.decodeKV
	// Recomputing blocks another candidate holds stalls every stream on
	// this worker for as long as it takes: under load that grows with the
	// streams, and it keeps sessions on their holders where a queue's
	// noise would otherwise scatter them. A prompt no one holds pays
	// nothing here, whatever the worker's streams.
	dup := float64(max(fleet.held-heldTokens(req, l), 0))
	t.slowdown = c.slowdown * float64(l.ActiveRequests) * dup / rate
	// Each active request costs its block-equivalents of prefill time: a
	// busy worker's decode steps are slower for every stream on it.
	t.slowdown += c.reqW * float64(l.ActiveRequests) * bs / rate
	capacity := l.KVTotalBlocks
	if l.ReportFresh && l.Report.KVTotalBlocks > 0 {
		capacity = l.Report.KVTotalBlocks
	}
	if capacity > 0 {
		need := blocksFor(req.PromptTokens+req.ExpectedOutputTokens, l.BlockSize) - l.MatchedBlocks
		if over := need - (capacity - l.KVUsedBlocks()); over > 0 {
			t.memory = float64(over) * bs / rate
		}
	}
	// Computing blocks another worker already has spends the fleet's
	// capacity twice; the holder wins until its queue costs more than that.
	if dup := fleet.held - heldTokens(req, l); dup > 0 {
		t.duplicate = c.duplicate * float64(dup) / rate
	}
	// Every uncached token a worker takes evicts one from its cache's
	// least recently used end; the more it took lately, relative to the
	// others, the younger that end, and the likelier a later prompt
	// wanted it. Only this request's own uncached tokens are charged, so
	// a prompt that hits its cache is not pushed off its holder.
	if fleet.meanChurn > 0 {
		t.churn = c.churn * uncached / rate * l.Churn / fleet.meanChurn
	}
	t.logit = t.ttft + t.slowdown + t.memory + t.duplicate + t.churn
	return t
}

// parts and finish are termsOf in two steps (see termsOf). finish
// completes parts against the fleet's view: termsOf's last terms and its
// sum, in its order.
func (c *latencyCost) finish(p *loadParts, fleet fleetView) float64 {
	dup := float64(max(fleet.held-p.held, 0))
	slowdown := p.slowdown * dup / p.rate
	slowdown += p.fixed
	// Computing blocks another worker already has spends the fleet's
	// capacity twice; the holder wins until its queue costs more than that.
	var duplicate, churn float64
	if dup := fleet.held - p.held; dup > 0 {
		duplicate = c.duplicate * float64(dup) / p.rate
	}
	if fleet.meanChurn > 0 {
		churn = p.churn / fleet.meanChurn
	}
	return p.base + slowdown + p.memory + duplicate + churn
}

func (c *latencyCost) logit(req *Request, l *Load, v fleetView) float64 {
	return c.termsOf(req, l, v).logit
}

// parts computes what termsOf needs of the candidate alone: p.base is
// the predicted TTFT; rate, context, slowdown (the slowdown weight ×
// active requests), fixed (the active requests' own slowdown), memory,
// held and churn (the churn term × the mean churn) are the rest. It sets
// every field the cost reads, in place: a decision prices each candidate.
func (c *latencyCost) parts(req *Request, l *Load, p *loadParts) {
	bs := float64(l.BlockSize)
	rate := l.PrefillRate
	if !(rate > 0) {
		rate = DefaultPrefillRate
	}
	held := float64(l.MatchedBlocks) + c.hostW*float64(l.HostBlocks) + c.diskW*float64(l.DiskBlocks)
	uncached := max(float64(req.PromptTokens)-held*bs, 0)
	backlog, backlogAttn := 0.0, 0.0
	if c.trackPrefill {
		backlog, backlogAttn = l.PrefillBacklog, l.PrefillBacklogAttention
	}
	cached := float64(req.PromptTokens) - uncached
	p.rate = rate
	p.context = l.PrefillContext * (backlogAttn + uncached*(cached+uncached/2))
	p.decodeKV = c.decodeKV*decodeKVWork(backlog+uncached, l.KVUsedBlocks()*l.BlockSize, l.MaxNumBatchedTokens) +
		l.PrefillPass*sharedPasses(backlog+uncached, l.ActiveRequests, l.MaxNumBatchedTokens)
	p.base = l.PrefillOverhead + (backlog+uncached)/rate + p.context + p.decodeKV
	// Recomputing blocks another candidate holds stalls every stream on
	// this worker for as long as it takes (finish): under load that
	// grows with the streams, and it keeps sessions on their holders where
	// a queue's noise would otherwise scatter them. A prompt no one holds
	// pays nothing there, whatever the worker's streams.
	p.slowdown = c.slowdown * float64(l.ActiveRequests)
	// Each active request costs its block-equivalents of prefill time: a
	// busy worker's decode steps are slower for every stream on it.
	p.fixed = c.reqW * float64(l.ActiveRequests) * bs / rate
	capacity := l.KVTotalBlocks
	if l.ReportFresh && l.Report.KVTotalBlocks > 0 {
		capacity = l.Report.KVTotalBlocks
	}
	p.memory = 0
	if capacity > 0 {
		need := blocksFor(req.PromptTokens+req.ExpectedOutputTokens, l.BlockSize) - l.MatchedBlocks
		if over := need - (capacity - l.KVUsedBlocks()); over > 0 {
			p.memory = float64(over) * bs / rate
		}
	}
	p.held = heldTokens(req, l)
	// Every uncached token a worker takes evicts one from its cache's
	// least recently used end; the more it took lately, relative to the
	// others, the younger that end, and the likelier a later prompt
	// wanted it. Only this request's own uncached tokens are charged, so
	// a prompt that hits its cache is not pushed off its holder.
	p.churn = c.churn * uncached / rate * l.Churn
	// finish adds the slowdown's duplicate part to fixed, and the
	// duplicate and churn terms, all ≥ 0, in this order.
	p.floor = p.base + p.fixed + p.memory
}
