package kvindex

// u64Table maps uint64 keys to uint64 values: a worker's engine hash key
// to router hash. Like bitTable it is open addressing with linear probing
// and backward-shift deletion, 16 bytes a slot, so heavy store/evict churn
// leaves no tombstones behind. Key 0 lives outside the slots.
type u64Table struct {
	slots   []u64Slot
	mask    uint64
	count   int // keys in slots, not counting key 0
	zero    uint64
	hasZero bool
}

type u64Slot struct {
	key, val uint64
}

func newU64Table() *u64Table {
	return &u64Table{slots: make([]u64Slot, minTableSize), mask: minTableSize - 1}
}

// len returns the number of keys.
func (t *u64Table) len() int {
	if t.hasZero {
		return t.count + 1
	}
	return t.count
}

func (t *u64Table) get(key uint64) (uint64, bool) {
	if key == 0 {
		return t.zero, t.hasZero
	}
	i := slotOf(key, t.mask)
	for {
		s := &t.slots[i]
		if s.key == key {
			return s.val, true
		}
		if s.key == 0 {
			return 0, false
		}
		i = (i + 1) & t.mask
	}
}

// put sets key to val and returns the previous value, if any.
func (t *u64Table) put(key, val uint64) (old uint64, had bool) {
	if key == 0 {
		old, had = t.zero, t.hasZero
		t.zero, t.hasZero = val, true
		return old, had
	}
	i := slotOf(key, t.mask)
	for {
		s := &t.slots[i]
		if s.key == key {
			old = s.val
			s.val = val
			return old, true
		}
		if s.key == 0 {
			s.key, s.val = key, val
			t.count++
			if t.count*4 > len(t.slots)*3 {
				t.resize(len(t.slots) * 2)
			}
			return 0, false
		}
		i = (i + 1) & t.mask
	}
}

// remove deletes key and returns its value, if it was there.
func (t *u64Table) remove(key uint64) (uint64, bool) {
	if key == 0 {
		v, had := t.zero, t.hasZero
		t.zero, t.hasZero = 0, false
		return v, had
	}
	i := slotOf(key, t.mask)
	for {
		s := &t.slots[i]
		if s.key == 0 {
			return 0, false
		}
		if s.key == key {
			v := s.val
			t.deleteAt(i)
			return v, true
		}
		i = (i + 1) & t.mask
	}
}

func (t *u64Table) deleteAt(i uint64) {
	t.count--
	j := i
	for {
		j = (j + 1) & t.mask
		s := t.slots[j]
		if s.key == 0 {
			break
		}
		home := slotOf(s.key, t.mask)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = u64Slot{}
	if len(t.slots) > minTableSize && t.count*8 < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *u64Table) resize(size int) {
	old := t.slots
	t.slots = make([]u64Slot, size)
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

// each calls fn for every key and value. fn must not modify t.
func (t *u64Table) each(fn func(key, val uint64)) {
	if t.hasZero {
		fn(0, t.zero)
	}
	for _, s := range t.slots {
		if s.key != 0 {
			fn(s.key, s.val)
		}
	}
}

func (t *u64Table) bytes() int { return len(t.slots) * 16 }

// touch is bitTable.touch for engine keys.
func (t *u64Table) touch(keys []uint64) (sink uint64) {
	for _, k := range keys {
		sink ^= t.slots[slotOf(k, t.mask)].key
	}
	return sink
}
