package tokenizer

// mergeEntry is a candidate merge of the symbol at pos with its right
// neighbour. left and right are the ids the pair had when it was pushed, so a
// stale entry is recognised when either side has since changed.
type mergeEntry struct {
	rank  uint32
	pos   int32
	left  uint32
	right uint32
	newID uint32
}

func (a mergeEntry) less(b mergeEntry) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

// mergeHeap applies merges to a long symbol list with a binary heap ordered
// by (rank, position), the reference's order, in O(n log n).
func (m *bpeModel) mergeHeap(st *encodeState, syms []uint32) []uint32 {
	n := len(syms)
	next := growInt32(st.next, n)
	prev := growInt32(st.prev, n)
	st.next, st.prev = next, prev
	h := st.heap[:0]
	for i := 0; i < n; i++ {
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
	}
	next[n-1] = -1
	alive := func(i int32) bool { return syms[i] != noRank }
	for i := 0; i < n-1; i++ {
		if r, nid := m.pair(syms[i], syms[i+1]); r != noRank {
			h = heapPush(h, mergeEntry{rank: r, pos: int32(i), left: syms[i], right: syms[i+1], newID: nid})
		}
	}
	for len(h) > 0 {
		var top mergeEntry
		top, h = heapPop(h)
		p := top.pos
		if !alive(p) || syms[p] != top.left {
			continue
		}
		q := next[p]
		if q < 0 || syms[q] != top.right {
			continue
		}
		syms[p] = top.newID
		syms[q] = noRank // removed
		nq := next[q]
		next[p] = nq
		if nq >= 0 {
			prev[nq] = p
		}
		if pp := prev[p]; pp >= 0 {
			if r, nid := m.pair(syms[pp], syms[p]); r != noRank {
				h = heapPush(h, mergeEntry{rank: r, pos: pp, left: syms[pp], right: syms[p], newID: nid})
			}
		}
		if nq >= 0 {
			if r, nid := m.pair(syms[p], syms[nq]); r != noRank {
				h = heapPush(h, mergeEntry{rank: r, pos: p, left: syms[p], right: syms[nq], newID: nid})
			}
		}
	}
	st.heap = h[:0]
	out := syms[:0]
	for i := 0; i < n; i++ {
		if syms[i] != noRank {
			out = append(out, syms[i])
		}
	}
	return out
}

func heapPush(h []mergeEntry, e mergeEntry) []mergeEntry {
	h = append(h, e)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeEntry) (mergeEntry, []mergeEntry) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			c = r
		}
		if !h[c].less(h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	return top, h
}

func growInt32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n, n*2)
	}
	return b[:n]
}
