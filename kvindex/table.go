package kvindex

// bitTable maps a router block hash to a 64-bit set of dense worker
// indices. It is an open-addressing table with linear probing, 16 bytes a
// slot and no per-entry pointers; key 0 marks an empty slot (HashBlocks
// never returns 0). Deletion shifts later entries back, so there are no
// tombstones. It is not safe for concurrent writes; Index guards it.
type bitTable struct {
	slots []bitSlot
	mask  uint64
	count int
	min   int // capacity it never shrinks below
}

type bitSlot struct {
	key  uint64
	bits uint64
}

const minTableSize = 64

func newBitTable(hint int) *bitTable {
	size := minTableSize
	for size*3/4 < hint {
		size *= 2
	}
	return &bitTable{slots: make([]bitSlot, size), mask: uint64(size - 1), min: size}
}

// slotOf spreads the key; router hashes are already uniform, but engine
// keys or test values may not be.
func slotOf(key, mask uint64) uint64 {
	return (key * 0x9e3779b97f4a7c15 >> 32) & mask
}

// get returns the worker set of key, or 0.
func (t *bitTable) get(key uint64) uint64 {
	i := slotOf(key, t.mask)
	for {
		s := &t.slots[i]
		if s.key == key {
			return s.bits
		}
		if s.key == 0 {
			return 0
		}
		i = (i + 1) & t.mask
	}
}

// set ors bit into key's set and reports whether it was already there.
func (t *bitTable) set(key, bit uint64) (had bool) {
	i := slotOf(key, t.mask)
	for {
		s := &t.slots[i]
		if s.key == key {
			had = s.bits&bit != 0
			s.bits |= bit
			return had
		}
		if s.key == 0 {
			s.key, s.bits = key, bit
			t.count++
			if t.count*4 > len(t.slots)*3 {
				t.resize(len(t.slots) * 2)
			}
			return false
		}
		i = (i + 1) & t.mask
	}
}

// clear removes bit from key's set, deleting the key when its set empties,
// and reports whether the bit was there.
func (t *bitTable) clear(key, bit uint64) (had bool) {
	i := slotOf(key, t.mask)
	for {
		s := &t.slots[i]
		if s.key == 0 {
			return false
		}
		if s.key == key {
			had = s.bits&bit != 0
			s.bits &^= bit
			if s.bits == 0 {
				t.deleteAt(i)
			}
			return had
		}
		i = (i + 1) & t.mask
	}
}

// deleteAt empties slot i and moves back any later entry of the same probe
// run that would otherwise become unreachable.
func (t *bitTable) deleteAt(i uint64) {
	t.count--
	j := i
	for {
		j = (j + 1) & t.mask
		s := t.slots[j]
		if s.key == 0 {
			break
		}
		home := slotOf(s.key, t.mask)
		// s may move to i if its home is not in the cyclic range (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = bitSlot{}
	if len(t.slots) > t.min && t.count*8 < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *bitTable) resize(size int) {
	old := t.slots
	t.slots = make([]bitSlot, size)
	t.mask = uint64(size - 1)
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := slotOf(s.key, t.mask)
		for t.slots[i].key != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = s
	}
}

// bytes is the table's memory footprint.
func (t *bitTable) bytes() int { return len(t.slots) * 16 }

// touch loads the home slot of every key so that the misses of a batch
// overlap instead of being paid one by one by the updates that follow.
// It returns a value only to keep the loads from being optimised away.
func (t *bitTable) touch(keys []uint64) (sink uint64) {
	for _, k := range keys {
		sink ^= t.slots[slotOf(k, t.mask)].key
	}
	return sink
}
