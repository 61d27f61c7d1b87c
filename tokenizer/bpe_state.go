package tokenizer

import "sync"

// encodeState holds the scratch buffers of one Encode call; it is pooled so
// that steady-state encoding allocates little more than the result.
type encodeState struct {
	segs   []segment
	inner  []segment
	pieces [2][]piece
	locs   []int
	mapped []byte
	syms   []uint32
	ranks  []uint32
	newIDs []uint32
	// heap merge scratch
	next, prev []int32
	heap       []mergeEntry
}

var statePool = sync.Pool{New: func() any { return new(encodeState) }}

func getEncodeState() *encodeState { return statePool.Get().(*encodeState) }

func putEncodeState(st *encodeState) {
	// Drop references into the caller's text so the pool does not pin it.
	clear(st.segs)
	clear(st.inner)
	clear(st.pieces[0])
	clear(st.pieces[1])
	if cap(st.syms) > 1<<16 {
		st.syms, st.ranks, st.newIDs, st.next, st.prev, st.heap = nil, nil, nil, nil, nil, nil
	}
	statePool.Put(st)
}
