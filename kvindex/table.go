package kvindex

// bitTable maps a router block hash to a 64-bit set of dense worker
// indices, with no per-entry pointers (see oaTable). HashBlocks never
// returns 0, so every router hash is a valid key. It is not safe for
// concurrent writes; Index and Approx guard it.
type bitTable struct {
	oaTable
}

func newBitTable(hint int) *bitTable { return &bitTable{newOATable(hint)} }

// get returns the worker set of key, or 0.
func (t *bitTable) get(key uint64) uint64 {
	n := len(t.slots)
	i := t.home(key)
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

// getMany is get for several keys, written so that the first probes of
// all keys are issued back to back and their cache misses overlap.
func (t *bitTable) getMany(keys, out []uint64) {
	var home [matchChunk]int
	for i, k := range keys {
		home[i] = t.home(k)
	}
	for i, k := range keys {
		s := &t.slots[home[i]]
		switch s.key {
		case k:
			out[i] = s.val
		case 0:
			out[i] = 0
		default:
			out[i] = t.get(k)
		}
	}
}
