package kvindex

import "unsafe"

// u64Table maps uint64 keys to uint64 values: a worker's engine hash key
// to the place of its block's cell. Key 0 lives beside the slots.
//
// It is extendible hashing over segments of 512 oaSlots (8 KB, buckets of
// four as in oaTable, linear probing within the segment, backward-shift
// deletion): the top bits of a key's mix pick a directory entry, which
// names a segment; the bits after those pick the home bucket in it. A full
// segment splits in two by its next bit, moving at most 448 keys between
// two segments that are in cache. One big slice instead rehashes every key
// into fresh pages, which the kernel zeroes, each time it grows: most of
// the cost of storing blocks while a fleet's caches fill. Here growing
// moves each key about once and leaves no garbage. A segment holds 224 to
// 448 keys once split, 18 to 37 bytes a key. The table rebuilds itself
// smaller when under a quarter of that load.
type u64Table struct {
	dir     []dirEntry // 1<<depth entries
	counts  []int32    // keys in each segment, by number
	depth   uint8      // global depth: the mix bits dir is indexed by
	count   int        // keys in segments
	zero    uint64
	hasZero bool
	// over holds the keys a full segment could not take because splitting
	// it would have grown the directory past maxDirPerSeg entries per
	// segment: keys whose mixes share that many leading bits, which only
	// keys chosen to collide have. nil until then.
	over map[uint64]*uint64
}

// maxDirPerSeg bounds the directory: a full segment whose split would
// take it past this many entries per segment overflows into a map
// instead.
const maxDirPerSeg = 64

// A dirEntry names the segment of the keys whose mixes start with its
// index, with what a lookup needs, so that it costs one load before the
// slot's: the segment's slots, its number and its depth (the leading bits
// its keys share; the segment has 2^(global depth - depth) consecutive
// entries).
type dirEntry struct {
	// slots is the segment's first slot: read through at, not a *[N]oaSlot,
	// whose indexing makes the compiler check it for nil by loading slot
	// 0, a cache miss of its own.
	slots unsafe.Pointer
	id    uint32
	depth uint8
}

// at returns slot i < segSlots of the segment.
func (e *dirEntry) at(i int) *oaSlot { return (*oaSlot)(unsafe.Add(e.slots, uintptr(i)*16)) }

const (
	segSlots   = 512
	segMaxKeys = segSlots * 7 / 8 // a segment this full splits before taking another key
	segHomeSh  = 64 - 7           // segSlots/bucketSlots = 1<<7 buckets
)

func newSegment() unsafe.Pointer { return unsafe.Pointer(new([segSlots]oaSlot)) }

func newU64Table() *u64Table {
	return &u64Table{dir: []dirEntry{{slots: newSegment()}}, counts: []int32{0}}
}

// mixKey spreads engine keys, which need not be uniform, over the high
// bits (Fibonacci hashing, as oaTable.home, a bijection): the directory
// reads the top ones, the home bucket the ones after those.
func mixKey(k uint64) uint64 { return k * 0x9e3779b97f4a7c15 }

// entry returns the directory entry of the key whose mix is m.
func (t *u64Table) entry(m uint64) *dirEntry { return &t.dir[m>>(64-t.depth)] }

// segHome is the first slot of m's bucket in a segment of the given depth.
func segHome(m uint64, depth uint8) int { return int((m<<depth)>>segHomeSh) * bucketSlots }

// len returns the number of keys.
func (t *u64Table) len() int {
	n := t.count + len(t.over)
	if t.hasZero {
		n++
	}
	return n
}

// find returns key's segment and slot index, or -1.
func (t *u64Table) find(key uint64) (*dirEntry, int) {
	m := mixKey(key)
	e := t.entry(m)
	i := segHome(m, e.depth)
	for {
		k := e.at(i).key
		if k == key {
			return e, i
		}
		if k == 0 {
			return e, -1
		}
		i = (i + 1) & (segSlots - 1)
	}
}

func (t *u64Table) get(key uint64) (uint64, bool) {
	if key == 0 {
		return t.zero, t.hasZero
	}
	if e, i := t.find(key); i >= 0 {
		return e.at(i).val, true
	}
	if v, ok := t.over[key]; ok {
		return *v, true
	}
	return 0, false
}

// put sets key to val and returns the previous value, if any.
func (t *u64Table) put(key, val uint64) (old uint64, had bool) {
	v, had := t.slot(key)
	old = *v
	*v = val
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
	m := mixKey(key)
	for {
		e := t.entry(m)
		i := segHome(m, e.depth)
		var s *oaSlot
		for {
			s = e.at(i)
			if s.key == key {
				return &s.val, true
			}
			if s.key == 0 {
				break
			}
			i = (i + 1) & (segSlots - 1)
		}
		if t.over != nil {
			if v, ok := t.over[key]; ok {
				return v, true
			}
		}
		if c := &t.counts[e.id]; *c < segMaxKeys {
			s.key = key // its val is 0: emptied slots are zeroed
			*c++
			t.count++
			return &s.val, false
		}
		if e.depth == t.depth && 2*len(t.dir) > maxDirPerSeg*len(t.counts) {
			if t.over == nil {
				t.over = map[uint64]*uint64{}
			}
			v := new(uint64)
			t.over[key] = v
			return v, false
		}
		t.split(m)
	}
}

// split divides the full segment of the key whose mix is m by the next
// bit of its keys' mixes, doubling the directory first if the segment has
// a single entry.
func (t *u64Table) split(m uint64) {
	e := *t.entry(m)
	d := e.depth
	if d == t.depth {
		dir := make([]dirEntry, 2*len(t.dir))
		for j, x := range t.dir {
			dir[2*j], dir[2*j+1] = x, x
		}
		t.dir = dir
		t.depth++
	}
	// The segment's entries: 2^(depth-d) from the one m's top bits pick.
	span := 1 << (t.depth - d)
	start := int(m>>(64-t.depth)) &^ (span - 1)
	lo := dirEntry{slots: e.slots, id: e.id, depth: d + 1}
	hi := dirEntry{slots: newSegment(), id: uint32(len(t.counts)), depth: d + 1}
	t.counts = append(t.counts, 0)
	for j := start; j < start+span; j++ {
		if j < start+span/2 {
			t.dir[j] = lo
		} else {
			t.dir[j] = hi
		}
	}
	seg := (*[segSlots]oaSlot)(e.slots)
	old := *seg
	clear(seg[:])
	t.counts[lo.id] = 0
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		to, sm := &lo, mixKey(s.key)
		if (sm<<d)>>63 == 1 {
			to = &hi
		}
		t.insertNew(to, s, sm)
	}
}

// insertNew puts s, whose key the segment of e lacks, in that segment,
// which has room for it.
func (t *u64Table) insertNew(e *dirEntry, s oaSlot, m uint64) {
	i := segHome(m, e.depth)
	for e.at(i).key != 0 {
		i = (i + 1) & (segSlots - 1)
	}
	*e.at(i) = s
	t.counts[e.id]++
}

// remove deletes key and returns its value, if it was there.
func (t *u64Table) remove(key uint64) (uint64, bool) {
	if key == 0 {
		v, had := t.zero, t.hasZero
		t.zero, t.hasZero = 0, false
		return v, had
	}
	var v uint64
	if e, i := t.find(key); i >= 0 {
		v = e.at(i).val
		e.deleteAt(i)
		t.counts[e.id]--
		t.count--
	} else if p, ok := t.over[key]; ok {
		v = *p
		delete(t.over, key)
	} else {
		return 0, false
	}
	// Rebuilding at a quarter of the least load a split leaves gives
	// segments at least twice as full, so churn does not rebuild it again.
	if len(t.counts) > 1 && (t.count+len(t.over))*8 < len(t.counts)*segMaxKeys {
		t.rebuild()
	}
	return v, true
}

// deleteAt empties slot i of e's segment and moves back every later entry
// of its probe run that could no longer be reached across the hole
// (oaTable.deleteAt within one segment).
func (e *dirEntry) deleteAt(i int) {
	j := i
	for {
		j = (j + 1) & (segSlots - 1)
		s := *e.at(j)
		if s.key == 0 {
			break
		}
		h := segHome(mixKey(s.key), e.depth)
		// s stays if its home lies cyclically in (i, j].
		if (i < j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			*e.at(i) = s
			i = j
		}
	}
	*e.at(i) = oaSlot{}
}

// rebuild replaces the segments with as few as the keys need.
func (t *u64Table) rebuild() {
	nt := newU64Table()
	t.each(func(k, v uint64) { nt.put(k, v) })
	*t = *nt
}

// each calls fn for every key and value. fn must not modify t.
func (t *u64Table) each(fn func(key, val uint64)) {
	if t.hasZero {
		fn(0, t.zero)
	}
	for j := 0; j < len(t.dir); {
		e := &t.dir[j]
		for _, s := range (*[segSlots]oaSlot)(e.slots) {
			if s.key != 0 {
				fn(s.key, s.val)
			}
		}
		j += 1 << (t.depth - e.depth)
	}
	for k, v := range t.over {
		fn(k, *v)
	}
}

// prefetch asks the CPU to start loading the home bucket of every key, and
// the bucket after it, without waiting for them, so that a batch's cache
// misses are all in flight at once instead of paid one by one by the
// updates that follow. at is scratch space; prefetch returns it.
func (t *u64Table) prefetch(keys []uint64, at []*oaSlot) []*oaSlot {
	at = at[:0]
	for _, k := range keys {
		m := mixKey(k)
		e := t.entry(m)
		h := segHome(m, e.depth)
		at = append(at, e.at(h), e.at((h+bucketSlots)&(segSlots-1)))
	}
	prefetchPtrs(at)
	return at
}

// bytes is the memory of the segments and the directory.
func (t *u64Table) bytes() int {
	return len(t.counts)*(segSlots*16+4) + len(t.dir)*int(unsafe.Sizeof(dirEntry{})) + len(t.over)*48
}
