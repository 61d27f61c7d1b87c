package kvindex

// holderTable maps a router block hash to the set of workers (dense
// slot numbers) that hold it, for Approx: one table for the whole fleet,
// so a lookup probes one slot per block however many workers there are.
// (Index keeps its sets in chains instead: chains.go.) It is an
// oaTable whose value encodes the set (the lanes below): up to four slots
// inline, more as a bitset in the table's setArena, which the blocks that
// one event changed alike share (begin). HashBlocks never
// returns 0, so every router hash is a valid key; a key is present
// exactly while its set is not empty, so a value of 0 means "held by
// nobody". It is not safe for concurrent writes; Approx guards it.
type holderTable struct {
	oaTable
	holderSets
}

// holderSets is what a table of holder sets keeps beside its slots: the
// big sets, and within a batch (begin, end) the changes made so far, so
// that blocks whose sets were equal share the result. holderTable and
// chainTable both hold their sets through it.
type holderSets struct {
	sets setArena
	// Within a batch (begin, end), the changes made so far.
	batch      bool
	adds, dels setMemo
}

// holderMaxLoad is the table's maximum load in percent: lower than
// u64Table's so that fewer buckets overflow on Match's path.
const holderMaxLoad = 60

func newHolderTable(hint int) *holderTable {
	return &holderTable{oaTable: newOATable(hint, holderMaxLoad), holderSets: newHolderSets()}
}

func newHolderSets() holderSets { return holderSets{sets: setArena{stride: 1}} }

// A set of worker slots in a slot's 64-bit value. Inline, its four
// 16-bit lanes hold slot+1 each, filled from lane 0, 0 for an empty lane.
// With 0xffff in the top lane it is a big set: the low 32 bits number a
// bitset in the setArena. A set goes big when a fifth worker joins (or a
// slot too large for a lane) and back inline when three or fewer remain,
// so a worker coming and going at the boundary does not convert it each
// time.
const (
	laneBits   = 16
	inlineCap  = 4
	bigTag     = 0xffff
	maxLane    = bigTag - 1 // largest slot+1 a lane holds
	shrinkAt   = 3          // a big set of this many goes back inline
	laneMask   = 1<<laneBits - 1
	topLaneOff = laneBits * (inlineCap - 1)
)

func isBig(v uint64) bool { return v>>topLaneOff == bigTag }

func bigVal(id uint32) uint64 { return bigTag<<topLaneOff | uint64(id) }

// has reports whether key's set contains slot.
func (t *holderTable) has(key uint64, slot int) bool {
	return t.contains(t.get(key), slot)
}

// contains reports whether the set v contains slot.
func (t *holderSets) contains(v uint64, slot int) bool {
	if isBig(v) {
		return t.sets.has(uint32(v), slot)
	}
	s := uint64(slot + 1)
	for ; v != 0; v >>= laneBits {
		if v&laneMask == s {
			return true
		}
	}
	return false
}

// get returns the set of key, or 0.
func (t *holderTable) get(key uint64) uint64 { return t.probeFrom(key, t.home(key)) }

// add puts slot into key's set and reports whether it was already there.
func (t *holderTable) add(key uint64, slot int) (had bool) {
	s, _ := t.upsert(key)
	// s stays put: only the arena may grow.
	return t.addTo(&s.val, slot)
}

// addTo puts slot into the set *v and reports whether it was already
// there.
func (t *holderSets) addTo(v *uint64, slot int) (had bool) {
	if t.contains(*v, slot) {
		return true
	}
	if !t.batch {
		*v = t.with(*v, slot)
		t.sets.settle()
		return false
	}
	if nv, ok := t.adds.get(*v, slot); ok {
		t.sets.retain(nv)
		t.drop(*v)
		*v = nv
		return false
	}
	nv := t.with(*v, slot)
	t.adds.put(*v, slot, nv)
	*v = nv
	return false
}

// with returns the set v plus slot (not in v), in place when v is a big
// set no other block shares.
func (t *holderSets) with(v uint64, slot int) uint64 {
	if isBig(v) {
		id := t.sets.own(uint32(v))
		t.sets.add(id, slot)
		return bigVal(id)
	}
	lane := uint64(slot + 1)
	n := 0
	for x := v; x != 0; x >>= laneBits {
		n++
	}
	if n < inlineCap && lane <= maxLane {
		return v | lane<<(laneBits*n)
	}
	// A fifth holder, or a slot past the lanes: the set goes big.
	id := t.sets.alloc()
	for x := v; x != 0; x >>= laneBits {
		t.sets.add(id, int(x&laneMask)-1)
	}
	t.sets.add(id, slot)
	return bigVal(id)
}

// remove takes slot out of key's set, deleting the key when its set
// empties, and reports whether slot was there.
func (t *holderTable) remove(key uint64, slot int) (had bool) {
	i := t.find(key)
	if i < 0 {
		return false
	}
	s := &t.slots[i]
	if !t.removeFrom(&s.val, slot) {
		return false
	}
	if s.val == 0 {
		t.deleteAt(i)
	}
	return true
}

// removeFrom takes slot out of the set *v and reports whether it was
// there.
func (t *holderSets) removeFrom(v *uint64, slot int) (had bool) {
	if !t.contains(*v, slot) {
		return false
	}
	switch got, ok := t.dels.get(*v, slot); {
	case !t.batch:
		*v = t.without(*v, slot)
		t.sets.settle()
	case ok:
		t.sets.retain(got)
		t.drop(*v)
		*v = got
	default:
		nv := t.without(*v, slot)
		t.dels.put(*v, slot, nv)
		*v = nv
	}
	return true
}

// without returns the set v less slot (in v), in place when v is a big
// set no other block shares.
func (t *holderSets) without(v uint64, slot int) uint64 {
	if isBig(v) {
		id := t.sets.own(uint32(v))
		t.sets.remove(id, slot)
		if t.sets.count[id] <= shrinkAt && t.sets.inlinable(id) {
			nv := t.sets.inline(id)
			t.sets.release(id)
			return nv
		}
		return bigVal(id)
	}
	lane := uint64(slot + 1)
	var out uint64
	n := 0
	for x := v; x != 0; x >>= laneBits {
		if l := x & laneMask; l != lane {
			out |= l << (laneBits * n)
			n++
		}
	}
	return out
}

// drop lets go of one block's share of the set v.
func (t *holderSets) drop(v uint64) {
	if isBig(v) {
		t.sets.release(uint32(v))
	}
}

// begin starts a batch of changes for one worker slot, such as the
// blocks of one event: blocks whose sets were equal before a change
// share one set after it, so that a prompt's run of blocks held by the
// same many workers keeps one bitset, which walk reads once. bulk is for
// batches in no particular order (a purge, a snapshot load): it
// remembers every change, not only the last. end finishes the batch.
// Outside a batch nothing is shared anew.
func (t *holderSets) begin(bulk bool) {
	t.batch = true
	t.adds.reset(bulk)
	t.dels.reset(bulk)
}

// end finishes a batch; set numbers freed during it become reusable only
// now, so that a remembered number always means the set it meant.
func (t *holderSets) end() {
	t.batch = false
	t.adds.reset(false)
	t.dels.reset(false)
	t.sets.settle()
}

// prefetch computes the home slot of each key into at and asks the CPU to
// start loading those buckets without waiting for them: walk prefetches a
// few chunks ahead of the ones it resolves, so that many cache misses are
// in flight at once. Plain loads would do the same only as far as the
// CPU's reorder window reaches (about one chunk of Match's code): each
// missing load holds up every instruction after it until it arrives, a
// prefetch holds up nothing.
func (t *oaTable) prefetch(keys []uint64, at []int) {
	at = at[:len(keys)]
	for i, k := range keys {
		at[i] = t.home(k)
	}
	if len(at) > 0 {
		prefetchSlots(t.slots, at)
	}
}

// resolve looks up keys (at most matchChunk) whose home slots are at,
// writing each key's set (or 0) to out: each key is looked for in its home
// bucket, in cache by then if prefetch loaded it. A key whose bucket is
// full without it may lie further on: resolve lists it in over, moves its
// at to the next bucket and prefetches that bucket, and returns how many
// it listed; finish completes those lookups. Walk calls finish a chunk
// later, so the second miss overlaps other work instead of stalling.
func (t *holderTable) resolve(keys []uint64, at []int, out []uint64, over *[matchChunk]uint8) (nover int) {
	at = at[:len(keys)]
	out = out[:len(keys)]
	for i, k := range keys {
		h := at[i]
		b := (*[bucketSlots]oaSlot)(t.slots[h : h+bucketSlots])
		// Branch-free (conditional moves): where in its bucket a key sits
		// is random, and a mispredicted branch here would stall the loads
		// still in flight.
		k0, k1, k2, k3 := b[0].key, b[1].key, b[2].key, b[3].key
		v0, v1, v2, v3 := b[0].val, b[1].val, b[2].val, b[3].val
		v := uint64(0)
		if k0 == k {
			v = v0
		}
		if k1 == k {
			v = v1
		}
		if k2 == k {
			v = v2
		}
		if k3 == k {
			v = v3
		}
		out[i] = v
		// Whether the bucket is full matters only for a key not found,
		// rare on a prompt's shared prefix.
		if v == 0 && k0 != 0 && k1 != 0 && k2 != 0 && k3 != 0 && nover < len(over) {
			over[nover] = uint8(i)
			nover++
		}
	}
	if nover == 0 {
		return 0
	}
	var next [matchChunk]int
	for j, i := range over[:nover] {
		h := at[i] + bucketSlots
		if h == len(t.slots) {
			h = 0
		}
		at[i] = h
		next[j] = h
	}
	prefetchSlots(t.slots, next[:nover])
	return nover
}

// prefetchSets asks the CPU to start loading the bitsets of the big sets
// among vals, as prefetch does for the table's buckets: walk uses a
// chunk's sets one stage after resolving it.
func (t *holderSets) prefetchSets(vals []uint64) {
	a := &t.sets
	var at [2 * matchChunk]int
	n := 0
	for _, v := range vals {
		if !isBig(v) {
			continue
		}
		// In 16-byte units, as prefetchLines counts; a set of more than
		// one cache line (over 512 slots) gets its first two.
		o := int(uint32(v)) * a.stride / 2
		at[n] = o
		n++
		if a.stride > 8 {
			at[n] = o + 4
			n++
		}
	}
	if n > 0 {
		prefetchWords(a.words, at[:n])
	}
}

// finish completes the lookups that resolve listed in over, probing on
// from their at.
func (t *holderTable) finish(keys []uint64, at []int, out []uint64, over []uint8) {
	for _, i := range over {
		out[i] = t.probeFrom(keys[i], at[i])
	}
}

// probeFrom is get continuing at slot i < len(t.slots).
func (t *holderTable) probeFrom(key uint64, i int) uint64 {
	n := len(t.slots)
	for {
		s := &t.slots[i]
		if s.key == key {
			return s.val
		}
		if s.key == 0 {
			return 0
		}
		if i++; i == n {
			i = 0
		}
	}
}
