// Package discovery finds the fleet's workers: records in etcd under a lease,
// or a static file where there is no etcd. A record is a scoring.WorkerSpec
// as JSON; the layout is the contract between workers (kvsim, kvbridge) and
// the router; see docs/architecture.md §3.1.
package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/kvroute/kvroute/scoring"
)

// ValidateRecord reports the problems that make a registration unusable.
// It is stricter than scoring.WorkerSpec.Validate: a record comes from the
// network, and its ID also names etcd keys and NATS subjects.
func ValidateRecord(r scoring.WorkerSpec) error {
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

// ParseRecord decodes and validates a record from JSON. Unknown fields are
// allowed so newer workers can add fields without breaking older routers.
func ParseRecord(data []byte) (scoring.WorkerSpec, error) {
	var r scoring.WorkerSpec
	if err := json.Unmarshal(data, &r); err != nil {
		return scoring.WorkerSpec{}, fmt.Errorf("worker record: %w", err)
	}
	if err := ValidateRecord(r); err != nil {
		return scoring.WorkerSpec{}, err
	}
	return r, nil
}
