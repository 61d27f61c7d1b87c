package kvindex

import "math/bits"

// jumpStride is how far apart walkJump's first probes are: one probe per
// window of jumpStride blocks, then a block-by-block walk of the one window
// where a worker's prefix ends.
const jumpStride = matchChunk

// walkJump is walk for workers whose holdings are closed under parents
// (links.prefixClosed): such a worker holds a prompt's block p only if it
// holds blocks 0..p, so whether it holds the last block of a window says
// whether it holds the whole window. walkJump probes the last block of up
// to matchChunk windows at once (their cache misses overlap), and for the
// workers that lack one walks that window alone to find where they stop.
// A 512-block prompt held to the end costs 32 probes instead of 512.
func walkJump(t *bitTable, hashes []uint64, alive uint64, depth []int32) {
	n := len(hashes)
	windows := (n + jumpStride - 1) / jumpStride
	var (
		keys [matchChunk]uint64
		at   [matchChunk]int
		got  [matchChunk]uint64
		over [matchChunk]uint8
		in   [64]int32 // depths within one window
	)
	// Most prompts that part from a worker do so in their first window:
	// load it along with the first probes rather than after them.
	t.prefetch(hashes[:min(jumpStride, n)], at[:])
	for g := 0; g < windows; g += matchChunk {
		k := keys[:min(matchChunk, windows-g)]
		for i := range k {
			k[i] = hashes[min((g+i+1)*jumpStride, n)-1]
		}
		t.prefetch(k, at[:])
		nover := t.resolve(k, at[:], got[:], &over)
		t.finish(k, at[:], got[:], over[:nover])
		for i := range k {
			dying := alive &^ got[i]
			if dying == 0 {
				continue
			}
			from := (g + i) * jumpStride
			walk(t, hashes[from:min(from+jumpStride, n)], dying, in[:])
			for d := dying; d != 0; d &= d - 1 {
				if b := bits.TrailingZeros64(d); b < len(depth) {
					depth[b] = int32(from) + in[b]
				}
			}
			if alive &^= dying; alive == 0 {
				return
			}
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		if b := bits.TrailingZeros64(alive); b < len(depth) {
			depth[b] = int32(n)
		}
	}
}
