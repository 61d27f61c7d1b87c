package kvindex

import "math/bits"

// setArena holds the big holder sets: bitsets over worker slots, stride
// words each, numbered from 0, with their member counts and how many
// blocks share each. A shared set is copied before it changes. Freed
// numbers are reused after settle. The stride grows (every set copied
// once) when a worker slot past it appears.
type setArena struct {
	stride  int
	words   []uint64
	count   []int32
	refs    []int32
	free    []uint32
	pending []uint32 // freed, reusable after settle
}

// set returns set id's bitset.
func (a *setArena) set(id uint32) []uint64 {
	o := int(id) * a.stride
	return a.words[o : o+a.stride : o+a.stride]
}

// alloc returns an empty set with one sharer.
func (a *setArena) alloc() uint32 {
	if n := len(a.free); n > 0 {
		id := a.free[n-1]
		a.free = a.free[:n-1]
		a.refs[id] = 1
		return id
	}
	id := uint32(len(a.count))
	a.count = append(a.count, 0)
	a.refs = append(a.refs, 1)
	a.words = append(a.words, make([]uint64, a.stride)...)
	return id
}

// own returns a set equal to id that only the caller's block holds: id
// itself, or a copy of it, leaving id to its other sharers.
func (a *setArena) own(id uint32) uint32 {
	if a.refs[id] == 1 {
		return id
	}
	c := a.alloc()
	copy(a.set(c), a.set(id))
	a.count[c] = a.count[id]
	a.refs[id]--
	return c
}

// retain adds a sharer to the set v, if big.
func (a *setArena) retain(v uint64) {
	if isBig(v) {
		a.refs[uint32(v)]++
	}
}

// release lets go of one sharer of set id, freeing it after the last.
func (a *setArena) release(id uint32) {
	if a.refs[id]--; a.refs[id] > 0 {
		return
	}
	clear(a.set(id))
	a.count[id] = 0
	a.pending = append(a.pending, id)
}

// settle makes the sets freed since the last settle reusable.
func (a *setArena) settle() {
	a.free = append(a.free, a.pending...)
	a.pending = a.pending[:0]
}

// widen makes room for slot in every set.
func (a *setArena) widen(slot int) {
	stride := a.stride
	for slot >= stride*64 {
		stride *= 2
	}
	if stride == a.stride {
		return
	}
	words := make([]uint64, len(a.count)*stride)
	for id := range a.count {
		copy(words[id*stride:], a.set(uint32(id)))
	}
	a.words, a.stride = words, stride
}

func (a *setArena) has(id uint32, slot int) bool {
	w := slot >> 6
	return w < a.stride && a.words[int(id)*a.stride+w]&(1<<(slot&63)) != 0
}

// add puts slot into set id and reports whether it was new.
func (a *setArena) add(id uint32, slot int) bool {
	a.widen(slot)
	p := &a.words[int(id)*a.stride+slot>>6]
	bit := uint64(1) << (slot & 63)
	if *p&bit != 0 {
		return false
	}
	*p |= bit
	a.count[id]++
	return true
}

// remove takes slot out of set id and reports whether it was there.
func (a *setArena) remove(id uint32, slot int) bool {
	if slot>>6 >= a.stride {
		return false
	}
	p := &a.words[int(id)*a.stride+slot>>6]
	bit := uint64(1) << (slot & 63)
	if *p&bit == 0 {
		return false
	}
	*p &^= bit
	a.count[id]--
	return true
}

// inlinable reports whether every member of set id fits in a lane.
func (a *setArena) inlinable(id uint32) bool {
	for i, w := range a.set(id) {
		if w != 0 && (i+1)*64 > maxLane {
			return false
		}
	}
	return true
}

// inline returns set id, of at most inlineCap members that fit in lanes,
// as an inline holderVal.
func (a *setArena) inline(id uint32) uint64 {
	var v uint64
	n := 0
	for i, w := range a.set(id) {
		for ; w != 0; w &= w - 1 {
			v |= uint64(i*64+bits.TrailingZeros64(w)+1) << (laneBits * n)
			n++
		}
	}
	return v
}

func (a *setArena) bytes() int {
	return len(a.words)*8 + len(a.count)*8 + (len(a.free)+len(a.pending))*4
}

// setMemo remembers, within a batch, what the sets changed by adding or
// removing one slot became: a block whose set was equal to one already
// changed takes the same result. Inline sets are values, big ones set
// numbers, so equal values mean equal sets.
type setMemo struct {
	slot     int
	from, to uint64
	valid    bool
	m        map[uint64]uint64 // bulk batches: every change
}

func (m *setMemo) reset(bulk bool) {
	m.valid = false
	if bulk {
		if m.m == nil {
			m.m = map[uint64]uint64{}
		}
		clear(m.m)
		m.slot = -1
	} else {
		m.m = nil
	}
}

func (m *setMemo) get(v uint64, slot int) (uint64, bool) {
	if m.m != nil {
		if slot != m.slot {
			return 0, false
		}
		nv, ok := m.m[v]
		return nv, ok
	}
	if m.valid && m.from == v && m.slot == slot {
		return m.to, true
	}
	return 0, false
}

func (m *setMemo) put(v uint64, slot int, nv uint64) {
	if m.m != nil {
		if slot != m.slot {
			clear(m.m)
			m.slot = slot
		}
		m.m[v] = nv
		return
	}
	m.from, m.to, m.slot, m.valid = v, nv, slot, true
}
