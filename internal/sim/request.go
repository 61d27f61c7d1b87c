package sim

import "github.com/kvroute/kvroute/kvindex"

// request is one generation request inside the engine. Only the engine
// touches its fields.
type request struct {
	id        uint64
	tokens    []int32 // prompt, then generated tokens
	numPrompt int
	maxTokens int
	// numComputed tokens of tokens have KV in blocks.
	numComputed int
	blocks      []int32
	// hashes are the engine hashes of tokens' full blocks, filled lazily.
	hashes []int64
	// numCachedBlocks leading blocks are registered in the prefix cache (or
	// were found there).
	numCachedBlocks int
	numOutput       int
	// cachedTokens is the prefix-cache hit when first scheduled, reported as
	// usage.prompt_tokens_details.cached_tokens.
	cachedTokens int
	scheduled    bool
	finished     bool
	outputSeed   uint64
	// mmKeys are the multimodal keys of the prompt's full blocks (nil: none).
	mmKeys [][]kvindex.MMKey
}

// ensureHashes computes the hashes of the first n full blocks.
func (r *request) ensureHashes(n, bs int, seed int64) {
	for i := len(r.hashes); i < n; i++ {
		parent := seed
		if i > 0 {
			parent = r.hashes[i-1]
		}
		h := blockHash(parent, r.tokens[i*bs:(i+1)*bs])
		if i < len(r.mmKeys) && len(r.mmKeys[i]) > 0 {
			h = mixMMKeys(h, r.mmKeys[i])
		}
		r.hashes = append(r.hashes, h)
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
