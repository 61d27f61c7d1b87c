package scoring

import "math/bits"

// blockRefs counts, per prompt block hash, the active requests on one
// worker that hold the block, so that a prefix shared by several requests
// counts once in the worker's KV use. Every Add writes it once per prompt
// block and every Free once more, on a worker whose table a large fleet
// has rarely left in cache, so it is an open-addressing table rather than
// a Go map: 16-byte slots of hash and count, four to a 64-byte bucket
// (a hash's home is the first slot of a bucket, so one cache line holds
// it unless the bucket overflowed), linear probing, backward-shift
// deletion (no tombstones), and hash 0, which marks an empty slot, kept
// beside the slots. A batch's lookups depend on one another only through
// the count they change, so the CPU overlaps their cache misses by
// itself (loading every home bucket first was measured slower). Like the
// map it replaces, the table keeps its size when requests end: a worker's
// busiest moment sizes it.
//
// The zero value is empty and ready. Guarded by Pool.mu.
type blockRefs struct {
	// slots has a power-of-two length (at least refsMinSlots), or is nil.
	slots []refSlot
	// used counts the slots holding a hash.
	used int
	// zero is the count of hash 0.
	zero int32
}

type refSlot struct {
	hash uint64
	n    int32
}

const (
	// refsMinSlots is a table's smallest size: 1 KiB.
	refsMinSlots = 64
	refsBucket   = 4 // slots per 64-byte cache line
)

// len is the number of hashes with a count.
func (t *blockRefs) len() int {
	if t.zero > 0 {
		return t.used + 1
	}
	return t.used
}

// count returns h's count, 0 when no active request holds it.
func (t *blockRefs) count(h uint64) int32 {
	if h == 0 {
		return t.zero
	}
	if i := t.find(h); i >= 0 {
		return t.slots[i].n
	}
	return 0
}

// add counts one more holder of every hash in hs (a hash listed twice
// counts twice).
func (t *blockRefs) add(hs []uint64) {
	t.reserve(len(hs))
	for _, h := range hs {
		if h == 0 {
			t.zero++
			continue
		}
		t.slots[t.upsert(h)].n++
	}
}

// release counts one holder less of every hash in hs, forgetting a hash
// whose count reaches 0. Hashes it does not hold are ignored.
func (t *blockRefs) release(hs []uint64) {
	if t.len() == 0 {
		return
	}
	for _, h := range hs {
		if h == 0 {
			t.zero = max(t.zero-1, 0)
			continue
		}
		i := t.find(h)
		if i < 0 {
			continue
		}
		if t.slots[i].n > 1 {
			t.slots[i].n--
			continue
		}
		t.deleteAt(i)
	}
}

// home is h's first slot, the start of its bucket. Block hashes are
// uniform, but tests' and peers' need not be, so h is mixed first.
func (t *blockRefs) home(h uint64) int {
	hi, _ := bits.Mul64(h*0x9e3779b97f4a7c15, uint64(len(t.slots)/refsBucket))
	return int(hi) * refsBucket
}

// find returns h's slot, or -1. h is not 0.
func (t *blockRefs) find(h uint64) int {
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

// upsert returns h's slot, inserting h with count 0 when absent. h is not
// 0, and reserve made room for it.
func (t *blockRefs) upsert(h uint64) int {
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
func (t *blockRefs) deleteAt(i int) {
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
	t.slots[i] = refSlot{}
}

// reserve grows the table, at most once, to hold k more hashes at no more
// than half full.
func (t *blockRefs) reserve(k int) {
	size := max(len(t.slots), refsMinSlots)
	for (t.used+k)*2 > size {
		size *= 2
	}
	if size != len(t.slots) {
		t.resize(size)
	}
}

func (t *blockRefs) resize(size int) {
	old := t.slots
	t.slots = make([]refSlot, size)
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
