package scoring

import "errors"

// ErrNoWorkers is returned when no known worker can serve a request.
var ErrNoWorkers = errors.New("scoring: no worker can serve the request")

// ErrUnknownWorker is returned by lifecycle calls that name a worker the
// pool does not hold.
var ErrUnknownWorker = errors.New("scoring: unknown worker")

// Candidate is one worker eligible for a request, with what the KV index
// knows about it. Callers build the list with Pool.AppendCandidates, drop
// workers outside any subset restriction, and fill in the overlap.
type Candidate struct {
	// Worker is the worker's ID.
	Worker string
	// MatchedBlocks is how many of the prompt's leading blocks the worker
	// already holds.
	MatchedBlocks int
	// CachedBlocks is the worker's total cached blocks; it breaks ties
	// toward the emptier cache.
	CachedBlocks int
	// HostBlocks and DiskBlocks count the blocks right after the matched
	// ones that the worker holds in host memory and on disk (offloaded KV,
	// e.g. LMCache or KVBM): cheaper to load than to compute.
	HostBlocks, DiskBlocks int
	// Stale says the index's view of the worker is out of date (awaiting a
	// resync): it gets no overlap credit, and its pending blocks do not
	// count either.
	Stale bool

	// w caches the worker AppendCandidates found, sparing picks a map
	// lookup per candidate; candidates built by hand work without it.
	w *worker
	// s is the worker's summary for the model (summary.go), set with w.
	s *workerSummary
}

// Request is what scoring needs to know about one request.
type Request struct {
	// ID identifies the request for the lifecycle calls; unique per router.
	ID string
	// Model is the requested model (base or LoRA adapter name).
	Model string
	// PromptTokens is the prompt's length in tokens. With body mode NONE it
	// is 0 and the request is routed on load alone.
	PromptTokens int
	// Hashes are the router block hashes of the prompt's full blocks (see
	// docs/architecture.md §3.5). Shared prefixes share hashes, which is how active blocks
	// are counted once per unique block. May be nil.
	Hashes []uint64
	// ExpectedOutputTokens is the caller's estimate of the output length
	// (e.g. max_tokens or an agent hint); 0 if unknown. It counts into the
	// request's own blocks in the cost.
	ExpectedOutputTokens int
	// Priority orders the admission queue; see ParsePriority. Not negative.
	Priority float64
}

// Decision is the outcome of a pick.
type Decision struct {
	// Worker is the chosen worker's ID.
	Worker string
	// Cluster is its Envoy cluster name.
	Cluster string
	// Address is its "ip:port".
	Address string
	// Index is the chosen entry's index in the candidate slice.
	Index int
	// MatchedBlocks is the chosen candidate's overlap: the blocks the index
	// matched, then PendingBlocks blocks of the pending overlay.
	MatchedBlocks int
	// PendingBlocks is the part of MatchedBlocks that the router sent the
	// worker recently and its KV events have not confirmed yet.
	PendingBlocks int
	// ForecastLostBlocks were matched after MatchedBlocks and are not
	// counted: the eviction forecast expects the allocations queued ahead
	// on the worker to evict them first (forecast.go).
	ForecastLostBlocks int
}
