package sim

import (
	"errors"
	"fmt"
)

// Engine defaults, the same as Dynamo's mocker.
const (
	DefaultNumGPUBlocks        = 16384
	DefaultBlockSize           = 64
	DefaultMaxNumSeqs          = 256
	DefaultMaxNumBatchedTokens = 8192
	// DefaultModel is the model name kvsim serves and kvbench asks for
	// unless told otherwise.
	DefaultModel = "Qwen/Qwen3-8B"
)

// EngineConfig sizes an Engine. The zero value of a field means its default.
type EngineConfig struct {
	// NumGPUBlocks is the number of KV blocks in the pool.
	NumGPUBlocks int
	// BlockSize is the number of tokens per KV block (vLLM uses 16).
	BlockSize int
	// MaxNumSeqs bounds the number of running requests.
	MaxNumSeqs int
	// MaxNumBatchedTokens bounds the tokens scheduled in one step.
	MaxNumBatchedTokens int
	// HashSeed seeds the engine's own block hashes (the parent of the first
	// block). Workers of one model should share it, as vLLM's do.
	HashSeed uint64
	// VocabSize bounds the generated token ids (default 32000).
	VocabSize int
}

// withDefaults fills zero fields with defaults.
func (c EngineConfig) withDefaults() EngineConfig {
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = DefaultNumGPUBlocks
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = DefaultMaxNumBatchedTokens
	}
	if c.VocabSize == 0 {
		c.VocabSize = 32000
	}
	return c
}

// Validate reports a configuration the engine cannot run with.
func (c EngineConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.NumGPUBlocks < 1 {
		errs = append(errs, fmt.Errorf("num_gpu_blocks %d must be at least 1", c.NumGPUBlocks))
	}
	if c.BlockSize < 1 {
		errs = append(errs, fmt.Errorf("block_size %d must be at least 1", c.BlockSize))
	}
	if c.MaxNumSeqs < 1 {
		errs = append(errs, fmt.Errorf("max_num_seqs %d must be at least 1", c.MaxNumSeqs))
	}
	if c.MaxNumBatchedTokens < 1 {
		errs = append(errs, fmt.Errorf("max_num_batched_tokens %d must be at least 1", c.MaxNumBatchedTokens))
	}
	if len(errs) > 0 {
		return fmt.Errorf("engine config: %w", errors.Join(errs...))
	}
	return nil
}

// TotalTokens is the KV capacity in tokens.
func (c EngineConfig) TotalTokens() int {
	c = c.withDefaults()
	return c.NumGPUBlocks * c.BlockSize
}
