package sim

import (
	"math/bits"

	"github.com/kvroute/kvroute/kvindex"
)

// The engine hashes blocks with its own chain: a multiply-xor hash over the
// parent hash and the block's token ids (two tokens per 64-bit word), with a
// final avalanche, truncated to int64 like vLLM's integer block hashes. It
// is deliberately not the router's xxh3 chain, so the router's mapping from
// engine hashes to its own is exercised and never bypassed.

const (
	mixPrime = 0xff51afd7ed558ccd // odd, so multiplication is a bijection
	seedMix  = 0x9e3779b97f4a7c15
)

// blockHash returns the engine hash of a block given its parent's hash.
// Two independent lanes of four tokens per round keep the multiplier busy.
func blockHash(parent int64, tokens []int32) int64 {
	a := uint64(parent) ^ seedMix
	b := uint64(parent)*mixPrime ^ uint64(len(tokens))
	i := 0
	for ; i+3 < len(tokens); i += 4 {
		w1 := uint64(uint32(tokens[i])) | uint64(uint32(tokens[i+1]))<<32
		w2 := uint64(uint32(tokens[i+2])) | uint64(uint32(tokens[i+3]))<<32
		a = (a ^ w1) * mixPrime
		b = (b ^ w2) * mixPrime
		a ^= a >> 29
		b ^= b >> 29
	}
	for ; i < len(tokens); i++ {
		a = (a ^ uint64(uint32(tokens[i]))) * mixPrime
		a ^= a >> 29
	}
	return int64(avalanche(a ^ bits.RotateLeft64(b, 31) ^ uint64(len(tokens))))
}

// avalanche is the splitmix64 finalizer.
func avalanche(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// OutputToken returns the i-th generated token of a request whose output
// seed is seed: deterministic, spread over [256, vocab).
func OutputToken(seed uint64, i int, vocab int) int32 {
	if vocab <= 512 {
		vocab = 32000
	}
	r := avalanche(seed + uint64(i)*seedMix)
	hi, _ := bits.Mul64(r, uint64(vocab-256))
	return int32(256 + hi)
}

// mixMMKeys folds a block's multimodal identifiers into its engine hash
// (FNV-1a over each id, then the splitmix finalizer), standing in for
// vLLM's hash of (parent, tokens, extra_keys).
func mixMMKeys(h int64, keys []kvindex.MMKey) int64 {
	x := uint64(h)
	for _, k := range keys {
		f := uint64(14695981039346656037)
		for i := 0; i < len(k.ID); i++ {
			f = (f ^ uint64(k.ID[i])) * 1099511628211
		}
		x = avalanche(x ^ f ^ uint64(int64(k.Offset))*mixPrime)
	}
	return int64(x)
}
