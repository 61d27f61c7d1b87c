package scoring

// blockRefs counts, per prompt block hash, the active requests on one
// worker that hold the block, so that a prefix shared by several requests
// counts once in the worker's KV use. Every Add writes it once per prompt
// block and every Free once more: a hashTable (hashtable.go) of counts,
// 16-byte slots.
//
// The zero value is empty and ready. Guarded by Pool.mu.
type blockRefs struct {
	hashTable[int32]
	// zero is the count of hash 0, which the table cannot hold.
	zero int32
}

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
		return t.slots[i].v
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
		t.slots[t.upsert(h)].v++
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
		if t.slots[i].v > 1 {
			t.slots[i].v--
			continue
		}
		t.deleteAt(i)
	}
}
