// Package discovery finds the fleet's workers: records in etcd under a lease,
// or a static file where there is no etcd. The record layout is the contract
// between workers (kvsim, kvbridge) and the router; see DESIGN 3.1.
package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
)

// Record is one worker's registration, stored as JSON at bus.WorkerKey(ns, ID).
type Record struct {
	// ID names the worker uniquely in the namespace. Data-parallel ranks of one
	// engine register separately as "<id>-dp<rank>".
	ID string `json:"id"`
	// Model is the served model name requests carry in their "model" field.
	Model string `json:"model"`
	// Address is "ip:port" of the worker's OpenAI-compatible server; it is what
	// the Gateway API header and ORIGINAL_DST routing use.
	Address string `json:"address"`
	// Cluster is the Envoy cluster name written into x-target-worker.
	// Empty means the same as ID.
	Cluster string `json:"cluster,omitempty"`
	// BlockSize is the engine's KV block size in tokens.
	BlockSize int `json:"block_size"`
	// KVTotalBlocks is the engine's KV capacity in blocks.
	KVTotalBlocks int `json:"kv_total_blocks"`
	// MaxNumBatchedTokens bounds the tokens the engine schedules per step.
	MaxNumBatchedTokens int `json:"max_num_batched_tokens,omitempty"`
	// MaxNumSeqs bounds the sequences the engine runs at once.
	MaxNumSeqs int `json:"max_num_seqs,omitempty"`
	// Weight is the worker's relative capacity for the weighted router mode.
	// Zero means 1.
	Weight float64 `json:"weight,omitempty"`
	// LoRAAdapters lists adapter names the worker serves besides Model.
	LoRAAdapters []string `json:"lora_adapters,omitempty"`
	// DPRank is the engine's data-parallel rank.
	DPRank int `json:"dp_rank,omitempty"`
}

// ClusterName returns the Envoy cluster this worker is reached through.
func (r Record) ClusterName() string {
	if r.Cluster != "" {
		return r.Cluster
	}
	return r.ID
}

// EffectiveWeight returns Weight, or 1 when unset.
func (r Record) EffectiveWeight() float64 {
	if r.Weight == 0 {
		return 1
	}
	return r.Weight
}

// Validate reports the first problem that makes the record unusable.
func (r Record) Validate() error {
	var errs []error
	if r.ID == "" {
		errs = append(errs, errors.New("id is empty"))
	} else if strings.ContainsAny(r.ID, "/ \t\n.*>") {
		errs = append(errs, fmt.Errorf("id %q contains a character not allowed in keys or NATS subjects", r.ID))
	}
	if r.Model == "" {
		errs = append(errs, errors.New("model is empty"))
	}
	if _, port, err := net.SplitHostPort(r.Address); err != nil || port == "" {
		errs = append(errs, fmt.Errorf("address %q is not ip:port", r.Address))
	}
	if r.BlockSize < 1 {
		errs = append(errs, fmt.Errorf("block_size %d must be at least 1", r.BlockSize))
	}
	if r.KVTotalBlocks < 0 || r.MaxNumBatchedTokens < 0 || r.MaxNumSeqs < 0 || r.DPRank < 0 {
		errs = append(errs, errors.New("kv_total_blocks, max_num_batched_tokens, max_num_seqs and dp_rank must not be negative"))
	}
	if r.Weight < 0 {
		errs = append(errs, fmt.Errorf("weight %g must not be negative", r.Weight))
	}
	for _, a := range r.LoRAAdapters {
		if a == "" {
			errs = append(errs, errors.New("lora_adapters holds an empty name"))
			break
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("worker record %q: %w", r.ID, errors.Join(errs...))
	}
	return nil
}

// Serves reports whether the worker serves model, as its base model or as a
// LoRA adapter.
func (r Record) Serves(model string) bool {
	if r.Model == model {
		return true
	}
	for _, a := range r.LoRAAdapters {
		if a == model {
			return true
		}
	}
	return false
}

// ParseRecord decodes and validates a record from JSON. Unknown fields are
// allowed so newer workers can add fields without breaking older routers.
func ParseRecord(data []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, fmt.Errorf("worker record: %w", err)
	}
	if err := r.Validate(); err != nil {
		return Record{}, err
	}
	return r, nil
}
