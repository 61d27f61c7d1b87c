package vllmwire

import "testing"

const benchBS = 16

// benchChain returns the tokens and engine hashes of a chain of n blocks
// of benchBS tokens, unique per id (the chain kvindex's benchmarks apply).
func benchChain(id, n int) ([]uint32, []EngineHash) {
	toks := make([]uint32, n*benchBS)
	for i := range toks {
		toks[i] = uint32(id)*7919 + uint32(i)*31 + 1
	}
	hs := make([]EngineHash, n)
	for j := range hs {
		hs[j] = HashUint(uint64(id)<<24 | uint64(j) + 1)
	}
	return toks, hs
}

// BenchmarkDecodeBatch decodes a batch of one 16-block BlockStored in the
// array format.
func BenchmarkDecodeBatch(b *testing.B) {
	toks, hs := benchChain(1, 16)
	data, err := EncodeBatch(EventBatch{TS: 1, Events: []Event{BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: benchBS, Medium: ptr(MediumGPU)}}})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		if _, err := DecodeBatch(data); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpu, 16, "blocks/s")
	b.ReportMetric(float64(16*b.N)/b.Elapsed().Seconds(), "blocks/s")
}
