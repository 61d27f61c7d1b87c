package kvindex

// u64Table maps uint64 keys to uint64 values: a worker's engine hash key
// to router hash (see oaTable). Key 0, which oaTable cannot hold, lives
// beside the slots.
type u64Table struct {
	oaTable
	zero    uint64
	hasZero bool
}

func newU64Table() *u64Table { return &u64Table{oaTable: newOATable(0, 75)} }

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
	if i := t.find(key); i >= 0 {
		return t.slots[i].val, true
	}
	return 0, false
}

// put sets key to val and returns the previous value, if any.
func (t *u64Table) put(key, val uint64) (old uint64, had bool) {
	if key == 0 {
		old, had = t.zero, t.hasZero
		t.zero, t.hasZero = val, true
		return old, had
	}
	s, inserted := t.upsert(key)
	old, had = s.val, !inserted
	s.val = val
	return old, had
}

// slot returns where key's value lives, adding key with value 0 if it is
// not there, and whether it was. The pointer is valid until t changes.
func (t *u64Table) slot(key uint64) (v *uint64, had bool) {
	if key == 0 {
		had = t.hasZero
		t.hasZero = true
		if !had {
			t.zero = 0
		}
		return &t.zero, had
	}
	s, inserted := t.upsert(key)
	return &s.val, !inserted
}

// remove deletes key and returns its value, if it was there.
func (t *u64Table) remove(key uint64) (uint64, bool) {
	if key == 0 {
		v, had := t.zero, t.hasZero
		t.zero, t.hasZero = 0, false
		return v, had
	}
	i := t.find(key)
	if i < 0 {
		return 0, false
	}
	v := t.slots[i].val
	t.deleteAt(i)
	return v, true
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
