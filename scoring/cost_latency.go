package scoring

import "math"

// latencyCost is CostLatency, in seconds of predicted time to first token
// plus what routing there costs the fleet:
//
//	logit    = overhead + (backlog + uncached) ÷ rate
//	         + context × (backlog attention + uncached × (cached + uncached ÷ 2))
//	         + decode KV cost × passes × KV tokens in use
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
// Options.DecodeKVCost), uncached = prompt tokens not held on
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

func (c *latencyCost) price(req *Request, loads []Load) {
	fleet := c.view(req, loads)
	for i := range loads {
		loads[i].logit = c.termsOf(req, &loads[i], fleet).logit
	}
}

func (c *latencyCost) explain(req *Request, loads []Load, _ *Explanation, terms []Terms) {
	fleet := c.view(req, loads)
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

// maxHeldTokens is the longest prompt prefix, in tokens, that any candidate
// holds on its device or is computing (the pending overlay).
func maxHeldTokens(req *Request, loads []Load) int {
	n := 0
	for i := range loads {
		n = max(n, heldTokens(req, &loads[i]))
	}
	return n
}

// heldTokens is how much of the prompt, in tokens, l's worker holds on its
// device or is computing.
func heldTokens(req *Request, l *Load) int {
	return min(l.MatchedBlocks*l.BlockSize, req.PromptTokens)
}

// fleetView is what the latency cost compares each candidate against: the
// longest prefix (tokens) any candidate holds, for the duplicate-prefill
// term, and the candidates' mean churn, for the churn term.
type fleetView struct {
	held      int
	meanChurn float64
}

func (c *latencyCost) view(req *Request, loads []Load) fleetView {
	var v fleetView
	if c.duplicate > 0 || c.slowdown > 0 {
		v.held = maxHeldTokens(req, loads)
	}
	if c.churn > 0 {
		for i := range loads {
			v.meanChurn += loads[i].Churn
		}
		v.meanChurn /= float64(len(loads))
	}
	return v
}

// termsOf predicts a candidate's cost against the fleet's view.
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
	t.decodeKV = c.decodeKV * decodeKVWork(backlog+uncached, l.KVUsedBlocks()*l.BlockSize, l.MaxNumBatchedTokens)
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
