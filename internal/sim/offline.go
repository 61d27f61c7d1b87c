package sim

import "github.com/kvroute/kvroute/kvevents/vllmwire"

// This file holds what a caller stepping Engines itself (the virtual-time
// simulator, internal/vsim) needs beyond Step: the KV event conversion the
// NATS publisher uses, and read-only views of the prefix cache and of the
// tokens a request will generate.

// KVIndexEvent converts an engine event to vllmwire's mirror of vLLM's
// types, copying the engine's slices.
func KVIndexEvent(e Event) vllmwire.Event { return toKVIndex(e) }

// PromptHashes returns the engine hashes of prompt's full blocks under cfg
// (block size and hash seed): what an Engine with cfg computes for it.
func PromptHashes(cfg EngineConfig, prompt []int32, dst []int64) []int64 {
	cfg = cfg.withDefaults()
	bs := cfg.BlockSize
	parent := int64(cfg.HashSeed)
	for i := 0; (i+1)*bs <= len(prompt); i++ {
		parent = blockHash(parent, prompt[i*bs:(i+1)*bs])
		dst = append(dst, parent)
	}
	return dst
}

// HeldPrefix returns how many leading blocks of hashes (PromptHashes of a
// prompt) are in the engine's prefix cache right now.
func (e *Engine) HeldPrefix(hashes []int64) int {
	for i, h := range hashes {
		if _, ok := e.pool.lookup(h); !ok {
			return i
		}
	}
	return len(hashes)
}

// AppendGenerated appends the n tokens an Engine with cfg generates for
// prompt: the output is a function of the prompt alone, so a workload can
// build the next turn of a conversation before the engine runs.
func AppendGenerated(cfg EngineConfig, prompt []int32, n int, dst []int32) []int32 {
	cfg = cfg.withDefaults()
	bs := cfg.BlockSize
	full := len(prompt) / bs
	last := int64(cfg.HashSeed)
	for i := 0; i < full; i++ {
		last = blockHash(last, prompt[i*bs:(i+1)*bs])
	}
	seed := uint64(blockHash(last, prompt[full*bs:]))
	for i := 0; i < n; i++ {
		dst = append(dst, OutputToken(seed, i, cfg.VocabSize))
	}
	return dst
}
