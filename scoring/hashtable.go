package scoring

import "math/bits"

// hashTable is the open-addressing core of the per-worker tables that
// requests and KV events write once per prompt block: the block
// references (blockrefs.go) and the pending overlay (pending.go). In a
// large fleet a worker's table has rarely stayed in cache since its last
// request, so they are not Go maps: slots of hash and value, linear
// probing from a home slot at the start of a bucket of four (with 16-byte
// slots, one cache line holds a hash unless its bucket overflowed),
// backward-shift deletion (no tombstones, so churn does not degrade it).
// A batch's lookups depend on one another little, so the CPU overlaps
// their cache misses by itself (loading every home bucket first was
// measured slower). Hash 0 marks an empty slot: the wrappers keep its
// value beside the table. Like a Go map, a table keeps its size when
// entries go: a worker's busiest moment sizes it.
//
// The methods work on slot indexes, valid until the next insert or
// delete, and are small enough to inline into the wrappers (returning
// pointers to values, or handling hash 0 here, was measured slower). The
// zero value is empty and ready.
type hashTable[V any] struct {
	// slots has a power-of-two length (at least tableMinSlots), or is nil.
	slots []hashSlot[V]
	// used counts the slots holding a hash.
	used int
}

type hashSlot[V any] struct {
	hash uint64
	v    V
}

const (
	// tableMinSlots is a table's smallest size.
	tableMinSlots = 64
	// tableBucket is the slots of a bucket; a home slot starts one.
	tableBucket = 4
)

// home is h's first slot, the start of its bucket. Block hashes are
// uniform, but tests' and peers' need not be, so h is mixed first.
func (t *hashTable[V]) home(h uint64) int {
	hi, _ := bits.Mul64(h*0x9e3779b97f4a7c15, uint64(len(t.slots)/tableBucket))
	return int(hi) * tableBucket
}

// find returns h's slot, or -1. h is not 0.
func (t *hashTable[V]) find(h uint64) int {
	n := len(t.slots)
	if n == 0 {
		return -1
	}
	i := t.home(h)
	for {
		switch t.slots[i].hash {
		case h:
			return i
		case 0:
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// upsert returns h's slot, inserting h with the zero V when absent. h is
// not 0, and reserve made room for it.
func (t *hashTable[V]) upsert(h uint64) int {
	n := len(t.slots)
	i := t.home(h)
	for {
		switch t.slots[i].hash {
		case h:
			return i
		case 0:
			t.slots[i].hash = h
			t.used++
			return i
		}
		if i++; i == n {
			i = 0
		}
	}
}

// deleteAt empties slot i and moves back every later entry of its probe
// run that could no longer be reached across the hole.
func (t *hashTable[V]) deleteAt(i int) {
	t.used--
	n := len(t.slots)
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		s := t.slots[j]
		if s.hash == 0 {
			break
		}
		h := t.home(s.hash)
		// s stays if its home lies cyclically in (i, j].
		if (i < j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = hashSlot[V]{}
}

// reserve grows the table, at most once, to hold k more hashes at no more
// than half full.
func (t *hashTable[V]) reserve(k int) {
	size := max(len(t.slots), tableMinSlots)
	for (t.used+k)*2 > size {
		size *= 2
	}
	if size != len(t.slots) {
		t.resize(size)
	}
}

// reset empties the table, keeping its slots.
func (t *hashTable[V]) reset() {
	if t.used > 0 {
		clear(t.slots)
		t.used = 0
	}
}

func (t *hashTable[V]) resize(size int) {
	old := t.slots
	t.slots = make([]hashSlot[V], size)
	for _, s := range old {
		if s.hash == 0 {
			continue
		}
		i := t.home(s.hash)
		for t.slots[i].hash != 0 {
			if i++; i == size {
				i = 0
			}
		}
		t.slots[i] = s
	}
}
