package kvindex

// u64Table maps uint64 keys to uint64 values: a worker's engine hash key
// to the place of its block's cell. Key 0 lives beside the slots.
//
// It is extendible hashing over segments of 512 oaSlots (8 KB, buckets of
// four as in oaTable, linear probing within the segment, backward-shift
// deletion): the top bits of a key's mix pick a directory entry, which
// names a segment; the bits after those pick the home bucket in it. A full
// segment splits in two by its next bit, moving at most 448 keys between
// two pages that are in cache. One big slice instead rehashes every key
// into fresh pages, which the kernel zeroes, each time it grows: most of
// the cost of storing blocks while a fleet's caches fill. Here growing
// moves each key about once and leaves no garbage. A segment holds 224 to
// 448 keys once split, 18 to 37 bytes a key. The table rebuilds itself
// smaller when under a quarter of that load.
type u64Table struct {
	dir     []uint32 // 1<<depth entries, each a segment number
	segs    []u64Seg
	depth   uint8 // global depth: the mix bits dir is indexed by
	count   int   // keys in segments
	zero    uint64
	hasZero bool
}

const (
	segSlots   = 512
	segBuckets = segSlots / bucketSlots
	segMaxKeys = segSlots * 7 / 8 // a segment this full splits before taking another key
	segHomeSh  = 64 - 7           // segBuckets = 1<<7
)

// A u64Seg is one segment: the keys whose mix starts with the segment's
// depth bits, 2^(global depth - depth) consecutive directory entries.
type u64Seg struct {
	// A slice, not a pointer to an array: taking &slots[i] of a pointer
	// makes the compiler check it for nil by loading slots[0], a cache
	// miss of its own.
	slots []oaSlot
	count int32
	depth uint8
}

func newU64Table() *u64Table {
	return &u64Table{dir: []uint32{0}, segs: []u64Seg{{slots: make([]oaSlot, segSlots)}}}
}

// mixKey spreads engine keys, which need not be uniform, over all 64 bits
// (MurmurHash3's finalizer, a bijection): the directory and the home
// bucket read different bits of it.
func mixKey(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// seg returns the segment number of the key whose mix is m.
func (t *u64Table) seg(m uint64) uint32 { return t.dir[m>>(64-t.depth)] }

// home is the first slot of m's bucket in a segment of the given depth.
func segHome(m uint64, depth uint8) int { return int((m<<depth)>>segHomeSh) * bucketSlots }

// len returns the number of keys.
func (t *u64Table) len() int {
	if t.hasZero {
		return t.count + 1
	}
	return t.count
}

// find returns key's segment and slot index, or -1.
func (t *u64Table) find(key uint64) (*u64Seg, int) {
	m := mixKey(key)
	sg := &t.segs[t.seg(m)]
	i := segHome(m, sg.depth)
	for {
		k := sg.slots[i].key
		if k == key {
			return sg, i
		}
		if k == 0 {
			return sg, -1
		}
		i = (i + 1) & (segSlots - 1)
	}
}

func (t *u64Table) get(key uint64) (uint64, bool) {
	if key == 0 {
		return t.zero, t.hasZero
	}
	if sg, i := t.find(key); i >= 0 {
		return sg.slots[i].val, true
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
		id := t.seg(m)
		sg := &t.segs[id]
		i := segHome(m, sg.depth)
		for {
			s := &sg.slots[i]
			if s.key == key {
				return &s.val, true
			}
			if s.key == 0 {
				break
			}
			i = (i + 1) & (segSlots - 1)
		}
		if sg.count < segMaxKeys {
			s := &sg.slots[i]
			s.key = key // its val is 0: emptied slots are zeroed
			sg.count++
			t.count++
			return &s.val, false
		}
		t.split(id, m)
	}
}

// split divides the full segment id, whose keys include the mix m, by the
// next bit of their mixes, doubling the directory first if the segment
// spans a single entry.
func (t *u64Table) split(id uint32, m uint64) {
	d := t.segs[id].depth
	if d == t.depth {
		dir := make([]uint32, 2*len(t.dir))
		for j, s := range t.dir {
			dir[2*j], dir[2*j+1] = s, s
		}
		t.dir = dir
		t.depth++
	}
	// The segment's entries: 2^(depth-d) from the one m's top bits pick.
	span := 1 << (t.depth - d)
	start := int(m>>(64-t.depth)) &^ (span - 1)
	nid := uint32(len(t.segs))
	t.segs = append(t.segs, u64Seg{slots: make([]oaSlot, segSlots), depth: d + 1})
	for j := start + span/2; j < start+span; j++ {
		t.dir[j] = nid
	}
	lo, hi := &t.segs[id], &t.segs[nid]
	var old [segSlots]oaSlot
	copy(old[:], lo.slots)
	clear(lo.slots)
	lo.count, lo.depth = 0, d+1
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		sg, m := lo, mixKey(s.key)
		if (m<<d)>>63 == 1 {
			sg = hi
		}
		sg.insertNew(s, m)
	}
}

// insertNew puts s, whose key the segment lacks, in the segment, which has
// room for it.
func (sg *u64Seg) insertNew(s oaSlot, m uint64) {
	i := segHome(m, sg.depth)
	for sg.slots[i].key != 0 {
		i = (i + 1) & (segSlots - 1)
	}
	sg.slots[i] = s
	sg.count++
}

// remove deletes key and returns its value, if it was there.
func (t *u64Table) remove(key uint64) (uint64, bool) {
	if key == 0 {
		v, had := t.zero, t.hasZero
		t.zero, t.hasZero = 0, false
		return v, had
	}
	sg, i := t.find(key)
	if i < 0 {
		return 0, false
	}
	v := sg.slots[i].val
	sg.deleteAt(i)
	t.count--
	// Rebuilding at a quarter of the least load a split leaves gives
	// segments at least twice as full, so churn does not rebuild it again.
	if len(t.segs) > 1 && t.count*8 < len(t.segs)*segMaxKeys {
		t.rebuild()
	}
	return v, true
}

// deleteAt empties slot i and moves back every later entry of its probe
// run that could no longer be reached across the hole (oaTable.deleteAt
// within one segment).
func (sg *u64Seg) deleteAt(i int) {
	sg.count--
	j := i
	for {
		j = (j + 1) & (segSlots - 1)
		s := sg.slots[j]
		if s.key == 0 {
			break
		}
		h := segHome(mixKey(s.key), sg.depth)
		// s stays if its home lies cyclically in (i, j].
		if (i < j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			sg.slots[i] = s
			i = j
		}
	}
	sg.slots[i] = oaSlot{}
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
		sg := &t.segs[t.dir[j]]
		for _, s := range sg.slots {
			if s.key != 0 {
				fn(s.key, s.val)
			}
		}
		j += 1 << (t.depth - sg.depth)
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
		sg := &t.segs[t.seg(m)]
		h := segHome(m, sg.depth)
		at = append(at, &sg.slots[h], &sg.slots[(h+bucketSlots)&(segSlots-1)])
	}
	prefetchPtrs(at)
	return at
}

// bytes is the memory of the segments and the directory.
func (t *u64Table) bytes() int { return len(t.segs)*(segSlots*16+32) + len(t.dir)*4 }
