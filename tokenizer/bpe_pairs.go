package tokenizer

// pairTable maps a merge pair (left<<32 | right) to (rank<<32 | new id). It
// is an open-addressing hash table with linear probing: the BPE inner loop
// does one lookup per candidate pair, and this is about twice as fast as a
// Go map for that.
type pairTable struct {
	slots []pairSlot
	shift uint
}

type pairSlot struct{ key, val uint64 }

// emptyPair marks a free slot; no pair has two ids of 0xFFFFFFFF.
const emptyPair = ^uint64(0)

func newPairTable(n int) *pairTable {
	size, shift := 1, uint(64)
	for size < n+n/2+1 {
		size <<= 1
		shift--
	}
	t := &pairTable{slots: make([]pairSlot, size), shift: shift}
	for i := range t.slots {
		t.slots[i].key = emptyPair
	}
	return t
}

func (t *pairTable) index(key uint64) uint64 {
	if t.shift == 64 {
		return 0
	}
	return (key * 0x9E3779B97F4A7C15) >> t.shift
}

// put inserts or replaces key; a later merge for the same pair wins, as in
// the reference's map.
func (t *pairTable) put(key, val uint64) {
	mask := uint64(len(t.slots) - 1)
	for i := t.index(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == key || s.key == emptyPair {
			s.key, s.val = key, val
			return
		}
	}
}

func (t *pairTable) get(key uint64) (uint64, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := t.index(key); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s.key == key {
			return s.val, true
		}
		if s.key == emptyPair {
			return 0, false
		}
	}
}
