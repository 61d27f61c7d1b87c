package sim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/kvindex"
)

// Engine is a vLLM-v1-like scheduler over a paged KV cache with prefix
// caching. It is pure logic: no goroutines, no clock. Each Step schedules one
// batch (running requests first, then waiting ones, with chunked prefill and
// preemption by recompute), "executes" it, and reports what a timing model
// needs. An Engine is not safe for concurrent use; one goroutine owns it.
type Engine struct {
	cfg  EngineConfig
	pool *blockPool
	sink EventSink
	seed int64

	reqs    map[uint64]*request
	running []*request
	waiting []*request // front is index 0

	sched []scheduled
	hits  []int32
	res   StepResult

	prefixQueries uint64
	prefixHits    uint64
	preemptions   uint64
}

type scheduled struct {
	req *request
	n   int
}

// StepResult describes one engine step. The engine reuses it: it is valid
// until the next call to Step.
type StepResult struct {
	// PrefillTokens is the number of uncached prompt (or recomputed) tokens
	// computed in the step: T in the polynomial, Σ N in a Profile.
	PrefillTokens int
	// PrefillAttention is Σ N·(C + N/2) over the requests prefilling in the
	// step, in token², where N is a request's new tokens in the step and C
	// the tokens it already had in KV (its cached prefix and earlier
	// chunks): the attention work of the chunk.
	PrefillAttention float64
	// PrefillContext is Σ C over the requests prefilling in the step.
	PrefillContext int
	// DecodeTokens is the number of requests that decoded one token.
	DecodeTokens int
	// DecodeKVTokens is the number of KV tokens the decoding requests read:
	// Σ over them of the tokens they held in KV before the step.
	DecodeKVTokens int
	// Scheduled is the number of requests in the batch.
	Scheduled int
	// Preempted counts requests preempted in the step.
	Preempted int
	// Outputs holds one entry per request that sampled a token.
	Outputs []Output
}

// Output is a token sampled for one request in a step.
type Output struct {
	ID uint64
	// Token is the sampled token id; Index its position in the output.
	Token int32
	Index int
	// PromptTokens and CachedTokens are the request's prompt length and its
	// prefix-cache hit in tokens at first scheduling.
	PromptTokens int
	CachedTokens int
	// Finished is set on the request's last token; its blocks are free.
	Finished bool
}

// Stats is a snapshot of the engine's counters.
type Stats struct {
	Running, Waiting        int
	UsedBlocks, TotalBlocks int
	// PrefixQueries and PrefixHits count tokens looked up in and found in
	// the prefix cache when requests were scheduled from the waiting queue.
	PrefixQueries, PrefixHits uint64
	Preemptions               uint64
}

// ErrRequest is wrapped by Add's errors about the request itself.
var ErrRequest = errors.New("invalid request")

// NewEngine returns an engine with cfg (zero fields take defaults) that
// sends KV events to sink (nil discards them).
func NewEngine(cfg EngineConfig, sink EventSink) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if sink == nil {
		sink = discardSink{}
	}
	return &Engine{
		cfg:  cfg,
		pool: newBlockPool(cfg.NumGPUBlocks, cfg.BlockSize),
		sink: sink,
		seed: int64(cfg.HashSeed),
		reqs: make(map[uint64]*request),
	}, nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() EngineConfig { return e.cfg }

// Add queues a request. id must be unique among the engine's live requests.
// The engine takes ownership of prompt and appends the generated tokens to
// it: give it spare capacity (len+maxTokens) to avoid a copy, and pass
// slices.Clip(prompt) if its backing array must stay untouched.
func (e *Engine) Add(id uint64, prompt []int32, maxTokens int) error {
	return e.AddMM(id, prompt, maxTokens, nil)
}

// AddMM is Add for a prompt with multimodal items placed in it: the
// identifiers of the items a block overlaps go into that block's hash (and
// its BlockStored extra_keys), as vLLM's generate_block_hash_extra_keys
// does, so that two images with the same placeholder tokens never share
// cached blocks.
func (e *Engine) AddMM(id uint64, prompt []int32, maxTokens int, mm []kvindex.MMPlacement) error {
	switch {
	case len(prompt) == 0:
		return fmt.Errorf("%w: empty prompt", ErrRequest)
	case maxTokens < 1:
		return fmt.Errorf("%w: max_tokens %d must be at least 1", ErrRequest, maxTokens)
	case ceilDiv(len(prompt)+maxTokens, e.cfg.BlockSize) > e.cfg.NumGPUBlocks:
		return fmt.Errorf("%w: %d prompt + %d output tokens exceed the KV capacity of %d tokens",
			ErrRequest, len(prompt), maxTokens, e.cfg.TotalTokens())
	}
	if _, dup := e.reqs[id]; dup {
		return fmt.Errorf("%w: duplicate request id %d", ErrRequest, id)
	}
	r := &request{
		id:        id,
		tokens:    prompt,
		hashes:    make([]int64, 0, (len(prompt)+maxTokens)/e.cfg.BlockSize),
		numPrompt: len(prompt),
		maxTokens: maxTokens,
	}
	bs := e.cfg.BlockSize
	r.mmKeys = kvindex.MMBlockKeys(mm, len(prompt), bs)
	full := len(prompt) / bs
	r.ensureHashes(full, bs, e.seed)
	last := e.seed
	if full > 0 {
		last = r.hashes[full-1]
	}
	r.outputSeed = uint64(blockHash(last, prompt[full*bs:]))
	e.reqs[id] = r
	e.waiting = append(e.waiting, r)
	return nil
}

// Abort removes a request wherever it is and frees its blocks. It reports
// whether the request was live.
func (e *Engine) Abort(id uint64) bool {
	r, ok := e.reqs[id]
	if !ok {
		return false
	}
	if i := slices.Index(e.running, r); i >= 0 {
		e.running = slices.Delete(e.running, i, i+1)
	} else if i := slices.Index(e.waiting, r); i >= 0 {
		e.waiting = slices.Delete(e.waiting, i, i+1)
	}
	e.pool.release(r.blocks)
	r.blocks = r.blocks[:0]
	delete(e.reqs, id)
	return true
}

// HasWork reports whether a Step would schedule anything.
func (e *Engine) HasWork() bool { return len(e.running) > 0 || len(e.waiting) > 0 }

// Reset drops the whole prefix cache, as a restarted GPU worker would: all
// running requests are preempted (they recompute later) and
// AllBlocksCleared is emitted.
func (e *Engine) Reset() {
	for i := len(e.running) - 1; i >= 0; i-- {
		e.preempt(e.running[i])
	}
	e.running = e.running[:0]
	e.pool.clear()
	e.sink.KVEvent(Event{Kind: AllBlocksCleared})
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{
		Running:       len(e.running),
		Waiting:       len(e.waiting),
		UsedBlocks:    e.pool.usedBlocks(),
		TotalBlocks:   e.cfg.NumGPUBlocks,
		PrefixQueries: e.prefixQueries,
		PrefixHits:    e.prefixHits,
		Preemptions:   e.preemptions,
	}
}

// Step schedules and executes one batch. With nothing to do it returns an
// empty result.
func (e *Engine) Step() *StepResult {
	res := &e.res
	*res = StepResult{Outputs: res.Outputs[:0]}
	e.sched = e.sched[:0]
	budget := e.cfg.MaxNumBatchedTokens
	preempted := e.scheduleRunning(&budget)
	if !preempted {
		e.scheduleWaiting(&budget)
	}
	e.execute(res)
	return res
}

// scheduleRunning gives each running request its next tokens (one for
// decode, a chunk for an unfinished prefill), preempting from the back of
// the running list when the cache is full. It reports whether it preempted.
func (e *Engine) scheduleRunning(budget *int) bool {
	preempted := false
	for i := 0; i < len(e.running) && *budget > 0; i++ {
		r := e.running[i]
		n := min(len(r.tokens)-r.numComputed, *budget)
		for !e.allocate(r, n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			e.res.Preempted++
			preempted = true
			if victim == r {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		e.sched = append(e.sched, scheduled{r, n})
		*budget -= n
	}
	return preempted
}

// scheduleWaiting admits waiting requests in order while the token budget,
// max_num_seqs and the cache allow, reusing their cached prefix.
func (e *Engine) scheduleWaiting(budget *int) {
	bs := e.cfg.BlockSize
	for len(e.waiting) > 0 && *budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting[0]
		// At least one token must be computed to produce logits, so a prompt
		// that is entirely cached still recomputes its last token.
		maxHit := (len(r.tokens) - 1) / bs
		r.ensureHashes(maxHit, bs, e.seed)
		e.hits = e.hits[:0]
		evictable := 0
		for _, h := range r.hashes[:maxHit] {
			id, ok := e.pool.lookup(h)
			if !ok {
				break
			}
			if e.pool.blocks[id].ref == 0 {
				evictable++
			}
			e.hits = append(e.hits, id)
		}
		computed := len(e.hits) * bs
		n := min(len(r.tokens)-computed, *budget)
		need := ceilDiv(computed+n, bs) - len(e.hits)
		if need > e.pool.numFree-evictable {
			return
		}
		for _, id := range e.hits {
			e.pool.touch(id)
		}
		r.blocks = append(r.blocks, e.hits...)
		r.numCachedBlocks = len(e.hits)
		r.numComputed = computed
		if !e.allocate(r, n) {
			panic("sim: allocation failed after capacity check") // invariant, not input
		}
		if !r.scheduled {
			r.scheduled = true
			r.cachedTokens = computed
		}
		e.prefixQueries += uint64(len(r.tokens))
		e.prefixHits += uint64(computed)
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		e.sched = append(e.sched, scheduled{r, n})
		*budget -= n
	}
}

// allocate gives r the blocks to hold n more tokens and caches the blocks
// those tokens fill. It changes nothing and reports false when the pool has
// too few free blocks.
func (e *Engine) allocate(r *request, n int) bool {
	upto := r.numComputed + n
	need := ceilDiv(upto, e.cfg.BlockSize) - len(r.blocks)
	if need > e.pool.numFree {
		return false
	}
	for ; need > 0; need-- {
		r.blocks = append(r.blocks, e.pool.allocate())
	}
	if ev := e.pool.takeEvicted(); len(ev) > 0 {
		e.sink.KVEvent(Event{Kind: BlockRemoved, Hashes: ev})
	}
	e.cacheFull(r, upto)
	return true
}

// cacheFull registers the full blocks among r's first upto tokens and emits
// BlockStored for each contiguous run of newly cached blocks.
func (e *Engine) cacheFull(r *request, upto int) {
	bs := e.cfg.BlockSize
	full := upto / bs
	if full <= r.numCachedBlocks {
		return
	}
	r.ensureHashes(full, bs, e.seed)
	start := -1
	for i := r.numCachedBlocks; i < full; i++ {
		parent, hasParent := int64(0), i > 0
		if hasParent {
			parent = r.hashes[i-1]
		}
		if e.pool.cacheBlock(r.blocks[i], r.hashes[i], parent, hasParent, r.tokens[i*bs:(i+1)*bs]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			e.emitStored(r, start, i)
			start = -1
		}
	}
	if start >= 0 {
		e.emitStored(r, start, full)
	}
	r.numCachedBlocks = full
}

func (e *Engine) emitStored(r *request, from, to int) {
	bs := e.cfg.BlockSize
	ev := Event{
		Kind:      BlockStored,
		Hashes:    r.hashes[from:to],
		Tokens:    r.tokens[from*bs : to*bs],
		BlockSize: bs,
	}
	if from < len(r.mmKeys) {
		ev.MMKeys = r.mmKeys[from:min(to, len(r.mmKeys))]
	}
	if from > 0 {
		ev.Parent, ev.HasParent = r.hashes[from-1], true
	}
	e.sink.KVEvent(ev)
}

// preempt frees r's blocks (they stay cached until evicted) and puts it at
// the front of the waiting queue to recompute from scratch.
func (e *Engine) preempt(r *request) {
	e.pool.release(r.blocks)
	r.blocks = r.blocks[:0]
	r.numComputed = 0
	r.numCachedBlocks = 0
	e.waiting = slices.Insert(e.waiting, 0, r)
	e.preemptions++
}

// execute advances every scheduled request and samples a token for those
// whose every known token now has KV.
func (e *Engine) execute(res *StepResult) {
	finished := false
	for _, s := range e.sched {
		r := s.req
		if r.numOutput > 0 && r.numComputed == len(r.tokens)-1 {
			res.DecodeTokens += s.n
			res.DecodeKVTokens += r.numComputed
		} else {
			res.PrefillTokens += s.n
			res.PrefillContext += r.numComputed
			res.PrefillAttention += float64(s.n) * (float64(r.numComputed) + float64(s.n)/2)
		}
		r.numComputed += s.n
		if r.numComputed < len(r.tokens) {
			continue
		}
		tok := OutputToken(r.outputSeed, r.numOutput, e.cfg.VocabSize)
		r.tokens = append(r.tokens, tok)
		r.numOutput++
		out := Output{
			ID: r.id, Token: tok, Index: r.numOutput - 1,
			PromptTokens: r.numPrompt, CachedTokens: r.cachedTokens,
		}
		if r.numOutput >= r.maxTokens {
			out.Finished = true
			r.finished = true
			finished = true
			e.pool.release(r.blocks)
			r.blocks = r.blocks[:0]
			delete(e.reqs, r.id)
		}
		res.Outputs = append(res.Outputs, out)
	}
	res.Scheduled = len(e.sched)
	if finished {
		e.running = slices.DeleteFunc(e.running, func(r *request) bool { return r.finished })
	}
}
