package kvindex

import "math/bits"

// oaTable is the open-addressing core under bitTable and u64Table: 16-byte
// slots of key and value, linear probing, key 0 marking an empty slot,
// backward-shift deletion (no tombstones, so heavy churn does not degrade
// it). Sizes are not powers of two: a key's home slot is the high half of
// key·φ times the size, the table grows by half when 3/4 full and halves
// when under 1/4 full, so its load stays between 1/2 and 3/4 after the
// first growth and memory per key between 21 and 32 bytes.
type oaTable struct {
	slots []oaSlot
	count int
	min   int // size it never shrinks below
}

type oaSlot struct {
	key, val uint64
}

const minTableSize = 64

func newOATable(hint int) oaTable {
	size := minTableSize
	for size*3/4 < hint {
		size += size / 2
	}
	return oaTable{slots: make([]oaSlot, size), min: size}
}

// home is key's first slot. Router hashes are uniform already; engine
// keys and test values may not be, so the key is mixed first.
func (t *oaTable) home(key uint64) int {
	hi, _ := bits.Mul64(key*0x9e3779b97f4a7c15, uint64(len(t.slots)))
	return int(hi)
}

// find returns key's slot index, or -1.
func (t *oaTable) find(key uint64) int {
	n := len(t.slots)
	i := t.home(key)
	for {
		k := t.slots[i].key
		if k == key {
			return i
		}
		if k == 0 {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// upsert returns key's slot, inserting it with value 0 if absent.
func (t *oaTable) upsert(key uint64) (s *oaSlot, inserted bool) {
	if (t.count+1)*4 > len(t.slots)*3 {
		t.resize(len(t.slots) + len(t.slots)/2)
	}
	n := len(t.slots)
	i := t.home(key)
	for {
		s := &t.slots[i]
		if s.key == key {
			return s, false
		}
		if s.key == 0 {
			s.key = key
			t.count++
			return s, true
		}
		if i++; i == n {
			i = 0
		}
	}
}

// deleteAt empties slot i and moves back every later entry of its probe
// run that could no longer be reached across the hole.
func (t *oaTable) deleteAt(i int) {
	t.count--
	n := len(t.slots)
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		s := t.slots[j]
		if s.key == 0 {
			break
		}
		h := t.home(s.key)
		// s stays if its home lies cyclically in (i, j].
		if (i < j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = oaSlot{}
	if len(t.slots) > t.min && t.count*4 < len(t.slots) {
		t.resize(max(t.min, len(t.slots)/2))
	}
}

func (t *oaTable) resize(size int) {
	old := t.slots
	t.slots = make([]oaSlot, size)
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].key != 0 {
			if i++; i == size {
				i = 0
			}
		}
		t.slots[i] = s
	}
}

// touch loads the home slot of every key so that the cache misses of a
// batch overlap instead of being paid one by one by the updates that
// follow. The result only keeps the loads from being optimised away.
func (t *oaTable) touch(keys []uint64) (sink uint64) {
	for _, k := range keys {
		sink ^= t.slots[t.home(k)].key
	}
	return sink
}

func (t *oaTable) bytes() int { return len(t.slots) * 16 }
