package kvindex

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
// instead of 512. sub is room for a bitset over every slot; died for a
// list of every slot.
func walkJump(t *chainTable, hashes []uint64, alive *aliveSet, depth []int32, sub []uint64, died []int32) {
	n := len(hashes)
	first := min(jumpStride, n)
	walkChains(t, hashes[:first], alive, 0, depth)
	if alive.n == 0 {
		return
	}
	var (
		keys [matchChunk]uint64
		at   [matchChunk]int
		got  [matchChunk]uint64
		part aliveSet
	)
	alive.track, alive.died = true, died[:0]
	windows := (n + jumpStride - 1) / jumpStride
	for g := 1; g < windows; g += matchChunk {
		k := keys[:min(matchChunk, windows-g)]
		for i := range k {
			k[i] = hashes[min((g+i+1)*jumpStride, n)-1]
		}
		t.prefetch(k, at[:])
		for i, key := range k {
			got[i] = t.get(key)
		}
		for i := range k {
			from := (g + i) * jumpStride
			left := alive.step(&t.holderSets, got[i], int32(from), depth)
			if len(alive.died) > 0 {
				// The workers that lack the window's last block stop
				// within it: walk the window for them alone.
				if len(alive.died) <= fewCap {
					part.fromList(alive.died)
				} else {
					clear(sub)
					for _, s := range alive.died {
						sub[s>>6] |= 1 << (s & 63)
					}
					part = aliveOf(sub)
				}
				walkChains(t, hashes[from:min(from+jumpStride, n)], &part, int32(from), depth)
				alive.died = alive.died[:0]
			}
			if !left {
				return
			}
		}
	}
	alive.finish(int32(n), depth)
}
