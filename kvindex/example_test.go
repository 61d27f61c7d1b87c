package kvindex_test

import (
	"fmt"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
)

// A worker reports stored blocks; the router hashes the prompt the same way
// and asks which candidate holds the longest prefix.
func Example() {
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w0", "Qwen/Qwen3-8B", 4)
	ix.AddWorker("w1", "Qwen/Qwen3-8B", 4)

	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{
		BlockHashes: []vllmwire.EngineHash{vllmwire.HashUint(101), vllmwire.HashUint(102)},
		TokenIDs:    prompt[:8],
		BlockSize:   4,
	}}})

	hashes := kvindex.HashBlocks(kvindex.Seed("Qwen/Qwen3-8B", "", ""), prompt, 4, nil)
	workers := []string{"w0", "w1"}
	for i, r := range ix.Match(hashes, workers, nil) {
		fmt.Printf("%s: %d of %d blocks\n", workers[i], r.Blocks, len(hashes))
	}
	// Output:
	// w0: 2 of 3 blocks
	// w1: 0 of 3 blocks
}
