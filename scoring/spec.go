package scoring

import (
	"errors"
	"fmt"
)

// ErrNoWorkers is returned when no known worker can serve a request.
var ErrNoWorkers = errors.New("scoring: no worker can serve the request")

// ErrUnknownWorker is returned by lifecycle calls that name a worker the
// pool does not hold.
var ErrUnknownWorker = errors.New("scoring: unknown worker")

// WorkerSpec is what the router knows about a worker from its registration.
// It holds static facts only; the live load lives in the Pool.
//
// It is also the registration itself: the JSON form below is the value
// workers store in etcd under bus.WorkerKey and list in the static workers
// file (package discovery reads both and checks them with ValidateRecord).
type WorkerSpec struct {
	// ID names the worker uniquely in the namespace. Data-parallel ranks of
	// one engine register separately as "<id>-dp<rank>".
	ID string `json:"id"`
	// Model is the served base model name requests carry in their "model"
	// field.
	Model string `json:"model"`
	// Address is "ip:port" of the worker's OpenAI-compatible server; it is
	// what the Gateway API header and ORIGINAL_DST routing use.
	Address string `json:"address"`
	// Cluster is the Envoy cluster name written into x-target-worker;
	// empty means ID.
	Cluster string `json:"cluster,omitempty"`
	// BlockSize is the engine's KV block size in tokens (at least 1).
	BlockSize int `json:"block_size"`
	// KVTotalBlocks is the engine's KV capacity in blocks; 0 means unknown.
	KVTotalBlocks int `json:"kv_total_blocks"`
	// MaxNumBatchedTokens bounds the tokens the engine schedules per step;
	// 0 means unknown, and such a worker never counts as saturated for the
	// admission queue.
	MaxNumBatchedTokens int `json:"max_num_batched_tokens,omitempty"`
	// MaxNumSeqs bounds the sequences the engine runs at once; 0 is unknown.
	MaxNumSeqs int `json:"max_num_seqs,omitempty"`
	// Weight is the worker's relative capacity for the weighted mode;
	// 0 means 1.
	Weight float64 `json:"weight,omitempty"`
	// LoRAAdapters lists adapter names the worker serves besides Model.
	LoRAAdapters []string `json:"lora_adapters,omitempty"`
	// DPRank is the engine's data-parallel rank. Scoring does not use it.
	DPRank int `json:"dp_rank,omitempty"`
	// EventsEndpoint is where this worker's engine publishes KV events
	// ("tcp://host:port"), for a router that dials engines (--engine-events
	// zmq). Empty: the worker's host at the fleet-wide events port plus
	// DPRank. Engines that share a host need one each.
	EventsEndpoint string `json:"events_endpoint,omitempty"`
	// ReplayEndpoint is this worker's engine's replay socket
	// ("tcp://host:port"). Empty: the worker's host at the fleet-wide
	// replay port plus DPRank, or none when that port is off.
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
}

// Validate reports the first problem that makes the spec unusable.
func (s WorkerSpec) Validate() error {
	switch {
	case s.ID == "":
		return errors.New("worker spec: id is empty")
	case s.Model == "":
		return fmt.Errorf("worker spec %q: model is empty", s.ID)
	case s.BlockSize < 1:
		return fmt.Errorf("worker spec %q: block size %d must be at least 1", s.ID, s.BlockSize)
	case s.KVTotalBlocks < 0 || s.MaxNumBatchedTokens < 0 || s.MaxNumSeqs < 0:
		return fmt.Errorf("worker spec %q: negative capacity", s.ID)
	case s.Weight < 0:
		return fmt.Errorf("worker spec %q: weight %g must not be negative", s.ID, s.Weight)
	}
	return nil
}

// ClusterName returns Cluster, or ID when Cluster is empty.
func (s WorkerSpec) ClusterName() string {
	if s.Cluster != "" {
		return s.Cluster
	}
	return s.ID
}

// EffectiveWeight returns Weight, or 1 when it is unset.
func (s WorkerSpec) EffectiveWeight() float64 {
	if s.Weight == 0 {
		return 1
	}
	return s.Weight
}

// Serves reports whether the worker serves model, as its base model or as a
// LoRA adapter.
func (s WorkerSpec) Serves(model string) bool {
	if s.Model == model {
		return true
	}
	for _, a := range s.LoRAAdapters {
		if a == model {
			return true
		}
	}
	return false
}

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
}
