package kvindex

import (
	"math/bits"
	"unsafe"
)

// u64Table maps uint64 keys to uint64 values: a worker's engine hash key
// to the place of its block's cell. Key 0 lives beside the slots.
//
// It is extendible hashing over segments of 512 oaSlots (8 KB): the top
// bits of a key's mix pick a directory entry, which names a segment; the
// bits after those pick the home group of eight slots in it. Beside the
// slots, every slot has a tag byte (empty, or seven bits of a second hash
// of its key), and every group an overflow count: how many keys probed
// past it to a later group. A segment's tags and counts (576 bytes) lie
// apart from its slots, so that those of a whole table stay in the cache
// where its slots do not. A probe reads its group's eight tags as one
// word, touches a slot only where a tag matches, and goes on to the next
// group only while the group's overflow count is not 0. Storing a key the
// table lacks reads no slot, only writes one; removing one reads the one
// slot it empties and leaves no tombstone: it counts down the groups its
// key had passed. (An overflow count that reaches 255 stays there until
// the segment is next refilled.) Beside the slot a key's probe always
// touches, that is one more cache line per key, the tags': a gain where
// the slots would have taken two lines or the tags are cached and the
// slots not (large events into large tables), a small loss where both
// are cold (single blocks into tables nobody touched for a while).
//
// A full segment splits in two by its next bit, moving at most 448 keys
// between two segments that are in cache. One big slice instead rehashes
// every key into fresh pages, which the kernel zeroes, each time it grows:
// most of the cost of storing blocks while a fleet's caches fill. Here
// growing moves each key about once and leaves no garbage. A segment holds
// 224 to 448 keys once split, 19 to 39 bytes a key. The table rebuilds
// itself smaller when under a quarter of that load.
//
// A table told how many keys it will hold (reserve: a worker's cache
// capacity) starts with its segments already split, so that filling it
// moves no key, and never rebuilds itself below that size. reservePlan
// keeps it at most 65 % full: fuller, a fifth of new keys find their home
// group full and land on a line the prefetch did not load. Where 2^d
// segments of 512 slots would be fuller and 2^(d+1) much emptier, it
// takes 2^d segments of 768 slots (96 groups, 12 KB; their home group is
// the 32 mix bits after the depth scaled to 96).
type u64Table struct {
	dir     []dirEntry // 1<<depth entries
	counts  []int32    // keys in each segment, by number
	depth   uint8      // global depth: the mix bits dir is indexed by
	count   int        // keys in segments
	zero    uint64
	hasZero bool
	// reserved is the keys reserve last planned the table for (0: none),
	// and floor the segments of that plan: the table does not shrink
	// below them.
	reserved, floor int
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
// tags': the segment's slots, its number and its depth (the leading bits
// its keys share; the segment has 2^(global depth - depth) consecutive
// entries).
type dirEntry struct {
	// slots is the segment's first slot: read through at, not a *[N]oaSlot,
	// whose indexing makes the compiler check it for nil by loading slot
	// 0, a cache miss of its own.
	slots unsafe.Pointer
	// meta is the segment's tags, a word per group (byte j of group g's
	// word, counted from the low end, tags slot 8g+j), then its overflow
	// counts, a byte per group (how many keys probed past it): 576 bytes
	// for segGroups groups, 864 for wideGroups.
	meta   unsafe.Pointer
	id     uint32
	depth  uint8
	groups uint8 // groups of eight slots: segGroups, or wideGroups in a table reserve sized
}

// tags returns group g's tag word.
func (e *dirEntry) tags(g int) *uint64 { return (*uint64)(unsafe.Add(e.meta, g*8)) }

// ovf returns group g's overflow count.
func (e *dirEntry) ovf(g int) *uint8 { return (*uint8)(unsafe.Add(e.meta, int(e.groups)*8+g)) }

// metaWords is the size of a segment's meta, in words.
func metaWords(groups uint8) int { return int(groups) + int(groups)/8 }

// newMeta returns zeroed meta for a segment of the given groups.
func newMeta(groups uint8) unsafe.Pointer {
	return unsafe.Pointer(unsafe.SliceData(make([]uint64, metaWords(groups))))
}

// at returns slot i < 8 × groups of the segment.
func (e *dirEntry) at(i int) *oaSlot { return (*oaSlot)(unsafe.Add(e.slots, uintptr(i)*16)) }

// home is the home group in the segment of the key whose mix is m: the
// 32 bits after the segment's depth, scaled to its groups (for segGroups,
// the 6 bits after the depth).
func (e *dirEntry) home(m uint64) int {
	if e.groups == segGroups {
		return int(m << e.depth >> (64 - 6))
	}
	return int((m << e.depth >> 32) * uint64(e.groups) >> 32)
}

// next is the group after g, wrapping.
func (e *dirEntry) next(g int) int {
	if g++; g == int(e.groups) {
		return 0
	}
	return g
}

// maxKeys is the keys the segment takes before it splits: seven eighths
// of its slots.
func (e *dirEntry) maxKeys() int32 { return int32(e.groups) * 7 }

const (
	segGroups  = 64 // a segment's groups as the table grows: 512 slots, 8 KB
	wideGroups = 96 // those of a segment reserve sizes wider: 768 slots

	tagLSB    = 0x0101010101010101
	tagMSB    = 0x8080808080808080 // an empty slot's tag is 0, a full one's has the high bit set
	ovfSticky = 0xff               // an overflow count this high no longer counts down
)

// newSegment returns the slots of a segment of the given groups.
func newSegment(groups uint8) unsafe.Pointer {
	return unsafe.Pointer(unsafe.SliceData(make([]oaSlot, int(groups)*8)))
}

func newU64Table() *u64Table {
	return &u64Table{
		dir:    []dirEntry{{slots: newSegment(segGroups), meta: newMeta(segGroups), groups: segGroups}},
		counts: []int32{0},
	}
}

// reservePlan returns how reserve lays out a table for n keys: 2^d
// segments of the given groups, the fewest slots that hold n keys at
// most 65 % full. Fuller, a fifth of new keys or more find their home
// group full and land on a line the prefetch did not load; segments of
// 96 groups fill the gap between 2^d and 2^(d+1) segments of 64.
func reservePlan(n int) (d uint8, groups uint8) {
	fits := func(g int) (uint8, int) {
		d := uint8(0)
		for (1<<d)*g*8*65 < n*100 {
			d++
		}
		return d, (1 << d) * g * 8
	}
	d, slots := fits(segGroups)
	if dw, wide := fits(wideGroups); wide < slots {
		return dw, wideGroups
	}
	return d, segGroups
}

// newU64TableFor returns an empty table with room for n keys, as
// reservePlan lays it out.
func newU64TableFor(n int) *u64Table {
	d, groups := reservePlan(n)
	if d == 0 && groups == segGroups {
		return newU64Table()
	}
	t := &u64Table{depth: d, dir: make([]dirEntry, 1<<d), counts: make([]int32, 1<<d), floor: 1 << d, reserved: n}
	for j := range t.dir {
		t.dir[j] = dirEntry{slots: newSegment(groups), meta: newMeta(groups), id: uint32(j), depth: d, groups: groups}
	}
	return t
}

// reserve makes room for n keys: a table with fewer slots than
// reservePlan gives n is rebuilt to that plan, its keys moved once. It
// does not shrink the table; from then on the table shrinks to no less
// than the plan.
func (t *u64Table) reserve(n int) {
	d, groups := reservePlan(n)
	if (1<<d)*int(groups) <= len(t.counts)*int(t.dir[0].groups) {
		t.reserved, t.floor = n, 1<<d
		return
	}
	nt := newU64TableFor(n)
	t.each(func(k, v uint64) { nt.put(k, v) })
	*t = *nt
}

// mixKey spreads engine keys, which need not be uniform, over the high
// bits (Fibonacci hashing, as oaTable.home, a bijection): the directory
// reads the top ones, the home group the ones after those.
func mixKey(k uint64) uint64 { return k * 0x9e3779b97f4a7c15 }

// tagOf is key's tag: seven bits of a second hash, independent of the
// mix's leading bits, with the high bit set.
func tagOf(k uint64) uint64 { return (k^k>>29)*0xbf58476d1ce4e5b9>>57 | 0x80 }

// matchTag has the high bit of each byte of w equal to tag set, and
// possibly of bytes above one that is: callers compare the key.
func matchTag(w, tag uint64) uint64 {
	x := w ^ tag*tagLSB
	return (x - tagLSB) &^ x & tagMSB
}

// matchEmpty has the high bit of each empty byte of w set.
func matchEmpty(w uint64) uint64 { return ^w & tagMSB }

// firstByte is the byte whose high bit is mask's lowest set bit.
func firstByte(mask uint64) int { return bits.TrailingZeros64(mask) >> 3 }

// entry returns the directory entry of the key whose mix is m.
func (t *u64Table) entry(m uint64) *dirEntry { return &t.dir[m>>(64-t.depth)] }

// setTag sets slot i's tag in tags.
func setTag(e *dirEntry, i int, tag uint64) {
	w, sh := e.tags(i>>3), uint(i&7)*8
	*w = *w&^(0xff<<sh) | tag<<sh
}

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
	tag := tagOf(key)
	g := e.home(m)
	for range e.groups {
		for mm := matchTag(*e.tags(g), tag); mm != 0; mm &= mm - 1 {
			if i := g*8 + firstByte(mm); e.at(i).key == key {
				return e, i
			}
		}
		if *e.ovf(g) == 0 {
			break
		}
		g = e.next(g)
	}
	return e, -1
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
	m, tag := mixKey(key), tagOf(key)
	// Most keys are new and their home group has room and was never
	// passed: one tag word read, one slot written.
	if e := t.entry(m); t.over == nil {
		g := e.home(m)
		w := *e.tags(g)
		for mm := matchTag(w, tag); mm != 0; mm &= mm - 1 {
			if s := e.at(g*8 + firstByte(mm)); s.key == key {
				return &s.val, true
			}
		}
		if f := matchEmpty(w); f != 0 && *e.ovf(g) == 0 && t.counts[e.id] < e.maxKeys() {
			b := firstByte(f)
			*e.tags(g) = w | tag<<(uint(b)*8)
			s := e.at(g*8 + b)
			*s = oaSlot{key: key}
			t.counts[e.id]++
			t.count++
			return &s.val, false
		}
	}
	for {
		e := t.entry(m)
		g := e.home(m)
		for range e.groups { // every group's count may be above 0
			for mm := matchTag(*e.tags(g), tag); mm != 0; mm &= mm - 1 {
				if s := e.at(g*8 + firstByte(mm)); s.key == key {
					return &s.val, true
				}
			}
			if *e.ovf(g) == 0 {
				break
			}
			g = e.next(g)
		}
		if t.over != nil {
			if v, ok := t.over[key]; ok {
				return v, true
			}
		}
		if t.counts[e.id] < e.maxKeys() {
			r := segRef{e: e}
			s := r.insert(oaSlot{key: key}, m, tag)
			t.counts[e.id]++
			t.count++
			// A store, where &s.val alone would make the compiler check s
			// for nil with a load, which waits for the slot's line.
			s.val = 0
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
	lo := dirEntry{slots: e.slots, meta: e.meta, id: e.id, depth: d + 1, groups: e.groups}
	hi := dirEntry{slots: newSegment(e.groups), meta: newMeta(e.groups), id: uint32(len(t.counts)), depth: d + 1, groups: e.groups}
	t.counts = append(t.counts, 0)
	for j := start; j < start+span; j++ {
		if j < start+span/2 {
			t.dir[j] = lo
		} else {
			t.dir[j] = hi
		}
	}
	seg := unsafe.Slice((*oaSlot)(e.slots), int(e.groups)*8)
	var oldSlots [wideGroups * 8]oaSlot
	var oldTags [wideGroups]uint64
	meta := unsafe.Slice((*uint64)(e.meta), metaWords(e.groups))
	old := oldSlots[:copy(oldSlots[:], seg)]
	copy(oldTags[:], meta[:e.groups])
	clear(seg)
	clear(meta)
	t.counts[e.id] = 0
	into := [2]segRef{{e: &lo}, {e: &hi}}
	for g, w := range oldTags[:e.groups] {
		for full := w & tagMSB; full != 0; full &= full - 1 {
			b := firstByte(full)
			s := old[g*8+b]
			sm := mixKey(s.key)
			into[(sm<<d)>>63].insert(s, sm, w>>(uint(b)*8)&0xff)
		}
	}
	t.counts[lo.id], t.counts[hi.id] = into[0].n, into[1].n
}

// A segRef is a segment and a count of the keys insert put in it.
type segRef struct {
	e *dirEntry
	n int32
}

// insert puts s, whose key the segment lacks and whose mix is m, with its
// tag in the first group from its home with an empty slot, counting it in
// the overflow of the groups before, and returns the slot. The segment
// must have room for it.
func (r *segRef) insert(s oaSlot, m, tag uint64) *oaSlot {
	e := r.e
	g := e.home(m)
	f := matchEmpty(*e.tags(g))
	for f == 0 {
		if o := e.ovf(g); *o != ovfSticky {
			*o++
		}
		g = e.next(g)
		f = matchEmpty(*e.tags(g))
	}
	i := g*8 + firstByte(f)
	setTag(e, i, tag)
	p := r.e.at(i)
	*p = s
	r.n++
	return p
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
		for g := e.home(mixKey(key)); g != i>>3; g = e.next(g) {
			if o := e.ovf(g); *o != ovfSticky {
				*o--
			}
		}
		setTag(e, i, 0)
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
	if len(t.counts) > max(t.floor, 1) && (t.count+len(t.over))*8 < len(t.counts)*int(t.dir[0].maxKeys()) {
		t.rebuild()
	}
	return v, true
}

// rebuild replaces the segments with as few as the keys need, and at
// least the reserved ones.
func (t *u64Table) rebuild() {
	nt := newU64TableFor(t.reserved)
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
		for i, s := range unsafe.Slice((*oaSlot)(e.slots), int(e.groups)*8) {
			if *e.tags(i >> 3)>>(uint(i&7)*8)&0x80 != 0 {
				fn(s.key, s.val)
			}
		}
		j += 1 << (t.depth - e.depth)
	}
	for k, v := range t.over {
		fn(k, *v)
	}
}

// prefetch asks the CPU to start loading the tags of every key's home
// group, its overflow count (a line of its own, which every store reads)
// and the group's slots, without waiting for them, so that a batch's cache
// misses are all in flight at once instead of paid one by one by the
// updates that follow. at is scratch space; prefetch returns it.
func (t *u64Table) prefetch(keys []uint64, at []unsafe.Pointer) []unsafe.Pointer {
	at = at[:0]
	for _, k := range keys {
		m := mixKey(k)
		e := t.entry(m)
		g := e.home(m)
		at = append(at, unsafe.Pointer(e.tags(g)), unsafe.Pointer(e.ovf(g)), unsafe.Pointer(e.at(g*8)), unsafe.Pointer(e.at(g*8+4)))
	}
	prefetchPtrs(at)
	return at
}

// bytes is the memory of the segments and the directory.
func (t *u64Table) bytes() int {
	g := t.dir[0].groups
	return len(t.counts)*(int(g)*8*16+metaWords(g)*8+4) + len(t.dir)*int(unsafe.Sizeof(dirEntry{})) + len(t.over)*48
}
