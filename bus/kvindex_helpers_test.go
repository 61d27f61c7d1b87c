package bus

import (
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
)

// These mirror kvindex's own test helpers, for the event consumer's tests.

const (
	testModel = "Qwen/Qwen3-8B"
	testBS    = 4
)

func ptr[T any](v T) *T { return &v }

// doc is a token sequence of n full blocks of testBS tokens, block j of
// doc d made of tokens (d<<16 | j<<4 | k).
func doc(d, n int) []uint32 {
	toks := make([]uint32, 0, n*testBS)
	for j := 0; j < n; j++ {
		for k := 0; k < testBS; k++ {
			toks = append(toks, uint32(d<<16|j<<4|k))
		}
	}
	return toks
}

// engineOf is a fake engine hash for block j of doc d.
func engineOf(d, j int) vllmwire.EngineHash {
	return vllmwire.HashUint(uint64(d)<<32 | uint64(j) + 1000)
}

// storeEv stores blocks [from, to) of doc d, chained to block from-1.
func storeEv(d, from, to int) vllmwire.BlockStored {
	ev := vllmwire.BlockStored{TokenIDs: doc(d, to)[from*testBS:], BlockSize: testBS, Medium: ptr(vllmwire.MediumGPU)}
	for j := from; j < to; j++ {
		ev.BlockHashes = append(ev.BlockHashes, engineOf(d, j))
	}
	if from > 0 {
		ev.ParentBlockHash = ptr(engineOf(d, from-1))
	}
	return ev
}

func promptHashes(d, n int) []uint64 {
	return kvindex.HashBlocks(kvindex.Seed(testModel, "", ""), doc(d, n), testBS, nil)
}
