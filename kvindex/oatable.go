package kvindex

import "math/bits"

// oaTable is the open-addressing core under holderTable and chainTable
// (u64Table's segments use its slots and buckets): 16-byte slots of key
// and value, linear probing, key 0 marking an empty slot, backward-shift
// deletion (no tombstones, so heavy churn does not degrade it). Slots come
// in buckets of four, one 64-byte cache line: a key's home is the first
// slot of a bucket, so the one line a lookup loads holds the key unless
// its bucket has overflowed. Measured on the Match benchmark's million
// keys, 2 % of keys lie past their home bucket at 42 % load and 8 % at
// 63 %; probing from any slot left 16 % outside their home's line at 63 %.
// Sizes are not powers of two: the home bucket is the high half of key·φ
// times the number of buckets. The table grows by half when maxLoad
// percent full and halves when under a third of that, so after the first
// growth its load stays between 2/3 and all of maxLoad: at 60 %
// (holderTable, chainTable) memory per key is between 27 and 40 bytes.
type oaTable struct {
	slots   []oaSlot
	count   int
	min     int // size it never shrinks below
	maxLoad int // percent of slots in use that makes it grow
}

type oaSlot struct {
	key, val uint64
}

const (
	minTableSize = 64
	bucketSlots  = 4 // 64 bytes: one cache line
)

func newOATable(hint, maxLoad int) oaTable {
	size := minTableSize
	for size*maxLoad/100 < hint {
		size = grownSize(size)
	}
	return oaTable{slots: make([]oaSlot, size), min: size, maxLoad: maxLoad}
}

// grownSize is size grown by half, in whole buckets.
func grownSize(size int) int {
	return (size + size/2 + bucketSlots - 1) &^ (bucketSlots - 1)
}

// home is key's first slot, the start of its bucket. Router hashes are
// uniform already; engine keys and test values may not be, so the key is
// mixed first.
func (t *oaTable) home(key uint64) int {
	hi, _ := bits.Mul64(key*0x9e3779b97f4a7c15, uint64(len(t.slots)/bucketSlots))
	return int(hi) * bucketSlots
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
	if (t.count+1)*100 > len(t.slots)*t.maxLoad {
		t.resize(grownSize(len(t.slots)))
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

// insert returns key's slot and true if key is there, else the slot it
// now has (value 0) and false. Unlike upsert it grows the table only when
// it adds the key.
func (t *oaTable) insert(key uint64) (s *oaSlot, found bool) {
	n := len(t.slots)
	i := t.home(key)
	for {
		s := &t.slots[i]
		if s.key == key {
			return s, true
		}
		if s.key == 0 {
			break
		}
		if i++; i == n {
			i = 0
		}
	}
	if (t.count+1)*100 > n*t.maxLoad {
		t.resize(grownSize(n))
		s, _ = t.upsert(key)
		return s, false
	}
	s = &t.slots[i]
	s.key = key
	t.count++
	return s, false
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
	// Shrinking at a third of the maximum leaves the halved table well
	// below it, so churn at the boundary does not resize back and forth.
	if len(t.slots) > t.min && t.count*300 < len(t.slots)*t.maxLoad {
		t.resize(max(t.min, len(t.slots)/2&^(bucketSlots-1)))
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

func (t *oaTable) bytes() int { return len(t.slots) * 16 }
