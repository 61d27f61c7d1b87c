package kvindex

// bitTable maps a router block hash to a 64-bit set of dense worker
// indices, with no per-entry pointers (see oaTable). HashBlocks never
// returns 0, so every router hash is a valid key. It is not safe for
// concurrent writes; Index and Approx guard it.
type bitTable struct {
	oaTable
}

// bitMaxLoad is the block table's maximum load in percent: lower than
// u64Table's so that fewer buckets overflow on Match's path.
const bitMaxLoad = 60

func newBitTable(hint int) *bitTable { return &bitTable{oaTable: newOATable(hint, bitMaxLoad)} }

// get returns the worker set of key, or 0.
func (t *bitTable) get(key uint64) uint64 { return t.probeFrom(key, t.home(key)) }

// set ors bit into key's set and reports whether it was already there.
func (t *bitTable) set(key, bit uint64) (had bool) {
	s, _ := t.upsert(key)
	had = s.val&bit != 0
	s.val |= bit
	return had
}

// clear removes bit from key's set, deleting the key when its set empties,
// and reports whether the bit was there.
func (t *bitTable) clear(key, bit uint64) (had bool) {
	i := t.find(key)
	if i < 0 {
		return false
	}
	s := &t.slots[i]
	had = s.val&bit != 0
	if s.val &^= bit; s.val == 0 {
		t.deleteAt(i)
	}
	return had
}

// prefetch computes the home slot of each key into at and asks the CPU to
// start loading those buckets without waiting for them: walk prefetches a
// few chunks ahead of the ones it resolves, so that many cache misses are
// in flight at once. Plain loads would do the same only as far as the
// CPU's reorder window reaches (about one chunk of Match's code): each
// missing load holds up every instruction after it until it arrives, a
// prefetch holds up nothing.
func (t *bitTable) prefetch(keys []uint64, at []int) {
	at = at[:len(keys)]
	for i, k := range keys {
		at[i] = t.home(k)
	}
	if len(at) > 0 {
		prefetchSlots(t.slots, at)
	}
}

// resolve looks up keys (at most matchChunk) whose home slots are at,
// writing each key's set (or 0) to out: each key is looked for in its home
// bucket, in cache by then if prefetch loaded it. A key whose bucket is
// full without it may lie further on: resolve lists it in over, moves its
// at to the next bucket and prefetches that bucket, and returns how many
// it listed; finish completes those lookups. Walk calls finish a chunk
// later, so the second miss overlaps other work instead of stalling.
func (t *bitTable) resolve(keys []uint64, at []int, out []uint64, over *[matchChunk]uint8) (nover int) {
	at = at[:len(keys)]
	out = out[:len(keys)]
	for i, k := range keys {
		h := at[i]
		b := (*[bucketSlots]oaSlot)(t.slots[h : h+bucketSlots])
		// Branch-free (conditional moves): where in its bucket a key sits
		// is random, and a mispredicted branch here would stall the loads
		// still in flight.
		k0, k1, k2, k3 := b[0].key, b[1].key, b[2].key, b[3].key
		v0, v1, v2, v3 := b[0].val, b[1].val, b[2].val, b[3].val
		v := uint64(0)
		if k0 == k {
			v = v0
		}
		if k1 == k {
			v = v1
		}
		if k2 == k {
			v = v2
		}
		if k3 == k {
			v = v3
		}
		out[i] = v
		// Whether the bucket is full matters only for a key not found,
		// rare on a prompt's shared prefix.
		if v == 0 && k0 != 0 && k1 != 0 && k2 != 0 && k3 != 0 && nover < len(over) {
			over[nover] = uint8(i)
			nover++
		}
	}
	if nover == 0 {
		return 0
	}
	var next [matchChunk]int
	for j, i := range over[:nover] {
		h := at[i] + bucketSlots
		if h == len(t.slots) {
			h = 0
		}
		at[i] = h
		next[j] = h
	}
	prefetchSlots(t.slots, next[:nover])
	return nover
}

// finish completes the lookups that resolve listed in over, probing on
// from their at.
func (t *bitTable) finish(keys []uint64, at []int, out []uint64, over []uint8) {
	for _, i := range over {
		out[i] = t.probeFrom(keys[i], at[i])
	}
}

// probeFrom is get continuing at slot i < len(t.slots).
func (t *bitTable) probeFrom(key uint64, i int) uint64 {
	n := len(t.slots)
	for {
		s := &t.slots[i]
		if s.key == key {
			return s.val
		}
		if s.key == 0 {
			return 0
		}
		if i++; i == n {
			i = 0
		}
	}
}
