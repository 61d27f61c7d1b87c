package fleet

import (
	"errors"
	"fmt"
)

// Worker is what the router knows about a worker from its registration.
// It holds static facts only; the live load lives in package scoring's Pool.
//
// It is also the registration itself: the JSON form below is the value
// workers store in etcd under bus.WorkerKey and list in the static workers
// file (package discovery reads both and checks them with ValidateRecord).
type Worker struct {
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
func (s Worker) Validate() error {
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
func (s Worker) ClusterName() string {
	if s.Cluster != "" {
		return s.Cluster
	}
	return s.ID
}

// EffectiveWeight returns Weight, or 1 when it is unset.
func (s Worker) EffectiveWeight() float64 {
	if s.Weight == 0 {
		return 1
	}
	return s.Weight
}

// Serves reports whether the worker serves model, as its base model or as a
// LoRA adapter.
func (s Worker) Serves(model string) bool {
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
