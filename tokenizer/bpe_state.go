package tokenizer

import (
	"sync"

	"golang.org/x/text/unicode/norm"
)

// encodeState holds the scratch buffers of one Encode call; it is pooled so
// that steady-state encoding allocates little more than the result.
type encodeState struct {
	segs   []segment
	inner  []segment
	pieces [2][]piece
	locs   []int
	syms   []uint32
	// merges[i] is the merge of syms[i] and syms[i+1] as rank<<32 | new id
	merges []uint64
	// heap merge scratch
	next, prev []int32
	heap       []mergeEntry
	// normalizer scratch: the normalized text and the form's state
	normBuf  []byte
	normIter *norm.Iter
	// piece-cache lookups of pieces that needed merges, for benchmarks
	cacheHits, cacheMisses int
}

var statePool = sync.Pool{New: func() any { return new(encodeState) }}

func getEncodeState() *encodeState { return statePool.Get().(*encodeState) }

func putEncodeState(st *encodeState) {
	// Drop references into the caller's text so the pool does not pin it, and
	// let buffers grown by one huge input go rather than keep them pooled.
	const keep = 1 << 18
	for i := range st.pieces {
		clear(st.pieces[i])
		if cap(st.pieces[i]) > keep {
			st.pieces[i] = nil
		}
	}
	clear(st.segs)
	clear(st.inner)
	if cap(st.segs) > keep || cap(st.inner) > keep {
		st.segs, st.inner = nil, nil
	}
	if cap(st.normBuf) > 4*keep {
		st.normBuf = nil
	}
	if cap(st.syms) > keep || cap(st.heap) > keep || cap(st.locs) > keep {
		st.syms, st.merges, st.next, st.prev, st.heap, st.locs = nil, nil, nil, nil, nil, nil
	}
	st.cacheHits, st.cacheMisses = 0, 0
	statePool.Put(st)
}
