package kvindex

import "math/bits"

// matchChunk is how many lookups walk resolves before using their results,
// and walkAhead how many chunks ahead of those it prefetches. On the
// 512-block benchmark one chunk ahead was about 8 % slower than two; three
// or four were no faster.
const (
	matchChunk = 16
	walkAhead  = 2
)

// fewCap is how many members an aliveSet lists before it keeps a bitset.
const fewCap = 8

// aliveSet is the candidates (worker slots) still matching during a walk:
// up to fewCap of them in a list, more in a bitset over the slots. It only
// shrinks. Each member that leaves gets its depth written.
type aliveSet struct {
	n    int
	few  [fewCap]int32
	bits []uint64 // nil once the set is a list
	// zeroed: every member's depth is 0 already, so the many that leave
	// at the prompt's first block, on a large fleet, need no writing.
	zeroed bool
	// touched, when not nil, lists the members given a depth other than
	// 0, so that a large fleet's results need not be looked for among
	// every slot. It has room for every slot (appending would move
	// Match's buffers to the heap).
	touched []int32
}

// aliveOf returns the set of the slots in b, which it keeps. (A value,
// not a method storing b through a pointer: that would move Match's
// stack buffers to the heap.)
func aliveOf(b []uint64) aliveSet {
	n := 0
	for _, w := range b {
		n += bits.OnesCount64(w)
	}
	a := aliveSet{n: n, bits: b}
	if n <= fewCap {
		a.toList()
	}
	return a
}

// fromList makes a a set of slots (at most fewCap, distinct).
func (a *aliveSet) fromList(slots []int32) {
	a.n = copy(a.few[:], slots)
	a.bits = nil
}

func (a *aliveSet) toList() {
	n := 0
	for i, w := range a.bits {
		for ; w != 0; w &= w - 1 {
			a.few[n] = int32(i*64 + bits.TrailingZeros64(w))
			n++
		}
	}
	a.n, a.bits = n, nil
}

func (a *aliveSet) die(slot int32, at int32, depth []int32) {
	depth[slot] = at
	if a.touched != nil && at != 0 {
		a.touched = a.touched[:len(a.touched)+1]
		a.touched[len(a.touched)-1] = slot
	}
}

// step keeps in a the members of holder set v and records the depth of
// the others as at. It reports whether any member remains.
func (a *aliveSet) step(t *holderSets, v uint64, at int32, depth []int32) bool {
	if a.bits == nil {
		if v == 0 {
			for _, s := range a.few[:a.n] {
				a.die(s, at, depth)
			}
			a.n = 0
			return false
		}
		k := 0
		for _, s := range a.few[:a.n] {
			if t.contains(v, int(s)) {
				a.few[k] = s
				k++
			} else {
				a.die(s, at, depth)
			}
		}
		a.n = k
		return k > 0
	}
	if isBig(v) {
		set := t.sets.set(uint32(v))
		for i, w := range a.bits {
			s := uint64(0)
			if i < len(set) {
				s = set[i]
			}
			d := w &^ s
			if d == 0 {
				continue
			}
			a.bits[i] = w & s
			a.n -= bits.OnesCount64(d)
			if at == 0 && a.zeroed {
				continue
			}
			for ; d != 0; d &= d - 1 {
				a.die(int32(i*64+bits.TrailingZeros64(d)), at, depth)
			}
		}
		if a.n <= fewCap {
			a.toList()
		}
		return a.n > 0
	}
	// At most inlineCap of the many members hold the block: list those
	// and record every other.
	var keep [inlineCap]int32
	k := 0
	for x := v; x != 0; x >>= laneBits {
		s := int(x&laneMask) - 1
		if w := s >> 6; w < len(a.bits) && a.bits[w]&(1<<(s&63)) != 0 {
			keep[k] = int32(s)
			k++
			a.bits[w] &^= 1 << (s & 63)
		}
	}
	if at != 0 || !a.zeroed {
		for i, w := range a.bits {
			for ; w != 0; w &= w - 1 {
				a.die(int32(i*64+bits.TrailingZeros64(w)), at, depth)
			}
		}
	}
	a.fromList(keep[:k])
	return k > 0
}

// finish records every remaining member at depth at.
func (a *aliveSet) finish(at int32, depth []int32) {
	if a.bits == nil {
		for _, s := range a.few[:a.n] {
			a.die(s, at, depth)
		}
		return
	}
	for i, w := range a.bits {
		for ; w != 0; w &= w - 1 {
			a.die(int32(i*64+bits.TrailingZeros64(w)), at, depth)
		}
	}
}

// walk (Approx's) sets depth[s] for every member s of alive to base plus
// the number of leading hashes whose holder set in t contains s. It works on chunks
// of matchChunk hashes in three stages: it resolves chunk c (whose buckets
// are in cache by then), finishes and uses chunk c-1, whose few keys that
// lay past their home bucket had that next bucket prefetched a chunk ago,
// and prefetches the buckets of chunk c+walkAhead. So the cache misses of
// several chunks overlap. It stops as soon as alive is empty, having
// prefetched at most walkAhead chunks, and resolved at most one, that it
// did not need. Its cost is one probe per block matched by anyone plus
// the members that leave, whatever the size of the fleet.
func walk(t *holderTable, hashes []uint64, alive *aliveSet, base int32, depth []int32) {
	if alive.n == 0 {
		return
	}
	n := len(hashes)
	// Chunk c's home slots are in at[c%walkRing], its sets in
	// got[c%2] and the keys resolve left to finish in over[c%2].
	const walkRing = walkAhead + 2 // chunks c-1 .. c+walkAhead
	var (
		at    [walkRing][matchChunk]int
		got   [2][matchChunk]uint64
		over  [2][matchChunk]uint8
		nover [2]int
		last  = ^uint64(0) // no set is all ones
	)
	chunk := func(c int) []uint64 {
		return hashes[min(c*matchChunk, n):min((c+1)*matchChunk, n)]
	}
	for c := 0; c < walkAhead; c++ {
		t.prefetch(chunk(c), at[c%walkRing][:])
	}
	// The first chunk is used as soon as it is resolved: many prompts
	// part from every candidate within it, and waiting for the next
	// chunk's loads first would cost them a whole memory latency.
	keys := chunk(0)
	nover[0] = t.resolve(keys, at[0][:], got[0][:], &over[0])
	t.finish(keys, at[0][:], got[0][:], over[0][:nover[0]])
	for j, v := range got[0][:len(keys)] {
		if v != last {
			last = v
			if !alive.step(&t.holderSets, v, base+int32(j), depth) {
				return
			}
		}
	}
	t.prefetch(chunk(walkAhead), at[walkAhead%walkRing][:])
	for c := 1; ; c++ {
		keys := chunk(c)
		if len(keys) > 0 {
			nover[c%2] = t.resolve(keys, at[c%walkRing][:], got[c%2][:], &over[c%2])
			t.prefetchSets(got[c%2][:len(keys)])
		}
		if p := c - 1; p >= 1 {
			pkeys := chunk(p)
			if len(pkeys) == 0 {
				break
			}
			g := &got[p%2]
			t.finish(pkeys, at[p%walkRing][:], g[:], over[p%2][:nover[p%2]])
			for j := range pkeys {
				// A run of blocks held by the same workers usually shares
				// one set (holderTable.begin): only a change is a step.
				if v := g[j]; v != last {
					last = v
					if !alive.step(&t.holderSets, v, base+int32(p*matchChunk+j), depth) {
						return
					}
				}
			}
		}
		// Only now, so that a walk that just ended prefetched no more.
		t.prefetch(chunk(c+walkAhead), at[(c+walkAhead)%walkRing][:])
	}
	alive.finish(base+int32(n), depth)
}
