package kvindex

import "math/bits"

// jumpStride is how far apart walkJump's first probes are: one probe per
// window of jumpStride blocks, then a block-by-block walk of the one window
// where a worker's prefix ends.
const jumpStride = matchChunk

// walkJump is walk for workers whose holdings are closed under parents
// (links.prefixClosed): such a worker holds a prompt's block p only if it
// holds blocks 0..p, so whether it holds the last block of a window says
// whether it holds the whole window. walkJump walks the first window block
// by block (most prompts that part from a worker do so early), then probes
// the last block of up to matchChunk windows at once (their cache misses
// overlap) and, for the workers that lack one, walks that window alone to
// find where they stop. A 512-block prompt held to the end costs 47 probes
// instead of 512.
func walkJump(t *bitTable, hashes []uint64, alive uint64, depth []int32) {
	n := len(hashes)
	var (
		keys [matchChunk]uint64
		at   [matchChunk]int
		got  [matchChunk]uint64
		over [matchChunk]uint8
		in   [64]int32 // depths within one window
	)
	// stop records the depth of the workers in dying, whose prefix ends in
	// the window starting at from, and reports whether any remain.
	stop := func(from int, dying uint64) bool {
		walk(t, hashes[from:min(from+jumpStride, n)], dying, in[:])
		for d := dying; d != 0; d &= d - 1 {
			if b := bits.TrailingZeros64(d); b < len(depth) {
				depth[b] = int32(from) + in[b]
			}
		}
		alive &^= dying
		return alive != 0
	}
	first := min(jumpStride, n)
	walk(t, hashes[:first], alive, in[:])
	dying := uint64(0)
	for a := alive; a != 0; a &= a - 1 {
		if b := bits.TrailingZeros64(a); in[b] < int32(first) {
			dying |= 1 << b
		}
	}
	if dying != 0 && !stop(0, dying) {
		return
	}
	windows := (n + jumpStride - 1) / jumpStride
	for g := 1; g < windows; g += matchChunk {
		k := keys[:min(matchChunk, windows-g)]
		for i := range k {
			k[i] = hashes[min((g+i+1)*jumpStride, n)-1]
		}
		t.prefetch(k, at[:])
		nover := t.resolve(k, at[:], got[:], &over)
		t.finish(k, at[:], got[:], over[:nover])
		for i := range k {
			if dying := alive &^ got[i]; dying != 0 && !stop((g+i)*jumpStride, dying) {
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
