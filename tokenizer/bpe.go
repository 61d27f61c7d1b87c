package tokenizer

import (
	"strings"
)

const (
	noRank = ^uint32(0)
	// heapThreshold is the symbol count above which merges use a heap; below
	// it a linear scan for the lowest rank is faster. Both pick the lowest
	// (rank, position) pair at every step, so they give the same result.
	heapThreshold = 48
	// maxCachedPiece is the longest piece (in bytes) kept in the piece cache.
	maxCachedPiece = 256
)

// bpeModel is a byte-pair-encoding model as tokenizer.json describes it.
type bpeModel struct {
	vocab    map[string]uint32 // token string as written in the file -> id
	tokens   []string          // id -> token string
	hasToken []bool
	// merges maps the pair (left<<32 | right) to (rank<<32 | new id).
	merges *pairTable
	// charID holds the ids of single-character tokens below U+10000 (-1 when
	// absent), so char-mode models skip a string-map lookup per character.
	charID []int32

	// byteMode runs the model on raw bytes: the pre-tokenizer chain ends with
	// ByteLevel and every byte has a token, so mapping bytes to the
	// byte-level alphabet and back is skipped.
	byteMode bool
	byteID   [256]uint32
	// raw, in byte mode, finds a piece's token by the piece's bytes.
	raw *rawVocab
	// bytePair, in byte mode, is the merge of every pair of bytes (indexed
	// by first<<8 | second) as rank<<32 | new id, or ^0 when the pair does
	// not merge: the first round of merges on a piece reads this dense
	// table, whose rows for letters stay in the CPU's cache, instead of
	// probing the pair table.
	bytePair *[1 << 16]uint64
	// charTok, in byte mode, is the token each character below U+10000
	// may start as, with the neighbours for which that is exact (see
	// bpe_chars.go).
	charTok   []uint32
	charMasks []charMask

	ignoreMerges bool
	byteFallback bool
	fallbackID   [256]int64 // id of "<0xXX>", -1 when absent
	unk          int64      // -1 when there is no unk token
	fuseUnk      bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix

	cache *pieceCache // nil disables caching

	// segment, when set, is a marker (SentencePiece's "▁") that no token
	// contains except in a leading run; pieces are cut before such runs.
	segment string
}

// pair returns the rank and new id of merging left and right, or noRank.
func (m *bpeModel) pair(left, right uint32) (uint32, uint32) {
	v, ok := m.merges.get(uint64(left)<<32 | uint64(right))
	if !ok {
		return noRank, 0
	}
	return uint32(v >> 32), uint32(v)
}

// encodePiece appends the ids of one pre-tokenized piece to dst.
func (m *bpeModel) encodePiece(st *encodeState, s string, dst []uint32) []uint32 {
	if m.segment == "" {
		return m.encodeWord(st, s, dst)
	}
	// No token spans a boundary before a run of the segment marker, so BPE on
	// the segments gives what BPE on the whole piece gives, much faster and
	// with the cache working for each word.
	start := 0
	for i := 1; i < len(s); {
		k := strings.Index(s[i:], m.segment)
		if k < 0 {
			break
		}
		j := i + k
		if !strings.HasSuffix(s[:j], m.segment) {
			dst = m.encodeWord(st, s[start:j], dst)
			start = j
		}
		i = j + len(m.segment)
	}
	return m.encodeWord(st, s[start:], dst)
}

// encodeWord appends the ids of one word (a piece, or a segment of one).
func (m *bpeModel) encodeWord(st *encodeState, s string, dst []uint32) []uint32 {
	if s == "" {
		return dst
	}
	if m.byteMode && len(s) == 1 {
		// One byte has nothing to merge with, and its token is in the vocab.
		return append(dst, m.byteID[s[0]])
	}
	if m.raw != nil {
		// A piece that is a token is that token when merges are ignored,
		// and also when merging its bytes is known to give it back.
		if id, self, ok := m.raw.get(s); ok && (self || m.ignoreMerges) {
			return append(dst, id)
		}
	} else if m.ignoreMerges {
		if id, ok := m.vocab[s]; ok {
			return append(dst, id)
		}
	}
	return m.mergeWord(st, s, dst)
}

// mergeWord appends the ids of a word the vocabulary lookup does not answer
// alone: from the piece cache, or by running the merges. Encode's streamed
// path (encodeSegment) calls it after its own lookup, so no piece is looked
// up twice.
func (m *bpeModel) mergeWord(st *encodeState, s string, dst []uint32) []uint32 {
	cacheable := m.cache != nil && len(s) < maxCachedPiece
	if cacheable {
		if ids, ok := m.cache.get(s); ok {
			st.cacheHits++
			return append(dst, ids...)
		}
		st.cacheMisses++
	}
	var syms []uint32
	switch {
	case m.byteMode && len(s) <= heapThreshold:
		syms = m.mergeBytes(st, s)
	case m.byteMode:
		syms = st.syms[:0]
		for i := 0; i < len(s); i++ {
			syms = append(syms, m.byteID[s[i]])
		}
		syms = m.mergeHeap(st, syms)
	default:
		syms = m.initialSymbols(s, st.syms[:0])
		if len(syms) > heapThreshold {
			syms = m.mergeHeap(st, syms)
		} else {
			syms = m.mergeLinear(st, syms)
		}
	}
	st.syms = syms[:0]
	if cacheable {
		m.cache.put(s, syms)
	}
	return append(dst, syms...)
}

// initialSymbols splits a piece into per-character tokens as the reference
// BPE does: continuing-subword prefix and end-of-word suffix, byte fallback
// for characters outside the vocabulary, then the unk token (fused if asked).
func (m *bpeModel) initialSymbols(s string, syms []uint32) []uint32 {
	unkPending := false
	flushUnk := func() {
		if unkPending {
			syms = append(syms, uint32(m.unk))
			unkPending = false
		}
	}
	for i := 0; i < len(s); {
		j := i + 1
		for j < len(s) && s[j]&0xC0 == 0x80 {
			j++
		}
		ch := s[i:j]
		if m.charID != nil {
			if r, _ := decode(s, i); r < rune(len(m.charID)) && m.charID[r] >= 0 {
				i = j
				flushUnk()
				syms = append(syms, uint32(m.charID[r]))
				continue
			}
		}
		if (m.prefix != "" && i > 0) || (m.suffix != "" && j == len(s)) {
			var b strings.Builder
			if i > 0 {
				b.WriteString(m.prefix)
			}
			b.WriteString(ch)
			if j == len(s) {
				b.WriteString(m.suffix)
			}
			ch = b.String()
		}
		i = j
		if id, ok := m.vocab[ch]; ok {
			flushUnk()
			syms = append(syms, id)
			continue
		}
		if m.byteFallback && m.appendFallback(ch, &syms) {
			// The reference adds byte tokens without flushing a pending unk.
			continue
		}
		if m.unk < 0 {
			continue
		}
		if unkPending && !m.fuseUnk {
			syms = append(syms, uint32(m.unk))
		}
		unkPending = true
	}
	flushUnk()
	return syms
}

// appendFallback appends the <0xXX> tokens of ch's bytes if all exist.
func (m *bpeModel) appendFallback(ch string, syms *[]uint32) bool {
	for k := 0; k < len(ch); k++ {
		if m.fallbackID[ch[k]] < 0 {
			return false
		}
	}
	for k := 0; k < len(ch); k++ {
		*syms = append(*syms, uint32(m.fallbackID[ch[k]]))
	}
	return true
}

// mergeLinear applies merges to a short symbol list by scanning for the
// lowest-ranked (then leftmost) adjacent pair at each step.
func (m *bpeModel) mergeLinear(st *encodeState, syms []uint32) []uint32 {
	n := len(syms)
	if n < 2 {
		return syms
	}
	merges := grow64(st.merges, n)
	st.merges = merges
	for i := 0; i < n-1; i++ {
		merges[i] = m.pairValue(syms[i], syms[i+1])
	}
	return mergeRanked(m, syms, merges)
}

// mergeBytes is mergeLinear on the bytes of s (byte mode, at least two
// bytes), taking the first round of pair ranks from the dense byte-pair
// table and starting a multi-byte character as its token where that is
// known to give the same result (see bpe_chars.go).
func (m *bpeModel) mergeBytes(st *encodeState, s string) []uint32 {
	n := len(s)
	syms := grow(st.syms, n)
	merges := grow64(st.merges, n)
	st.syms, st.merges = syms, merges
	bp := m.bytePair
	k := 0
	prev := -1 // the raw byte of syms[k-1], or -1 when it is a whole character
	for i := 0; i < n; k++ {
		c := s[i]
		if c >= 0xC2 && m.charTok != nil {
			if id, second, size := m.wholeChar(s, i); size > 0 {
				syms[k] = id
				if k > 0 {
					merges[k-1] = m.pairValue(syms[k-1], id)
				}
				if second != noRank {
					merges[k] = noMerge
					k++
					syms[k] = second
				}
				prev = -1
				i += size
				continue
			}
		}
		syms[k] = m.byteID[c]
		if prev >= 0 {
			merges[k-1] = bp[uint16(prev)<<8|uint16(c)]
		} else if k > 0 {
			merges[k-1] = m.pairValue(syms[k-1], syms[k])
		}
		prev = int(c)
		i++
	}
	return mergeRanked(m, syms[:k], merges[:k])
}

// pairValue is pair packed as rank<<32 | new id, with rank noRank (and id
// 0) when the pair does not merge: the layout of the pair table's values
// and of bytePair.
func (m *bpeModel) pairValue(left, right uint32) uint64 {
	v, ok := m.merges.get(uint64(left)<<32 | uint64(right))
	if !ok {
		return noMerge
	}
	return v
}

// noMerge is pairValue's answer for a pair that does not merge.
const noMerge = uint64(noRank) << 32

// mergeRanked runs the merges on syms given the merge of every adjacent
// pair (merges[i], as pairValue gives it, for syms[i], syms[i+1]): it
// merges the lowest-ranked, then leftmost, pair until none is left.
//
// Each candidate is packed as rank<<32 | position, so the least packed
// value is the lowest rank and, among equal ranks, the leftmost, and the
// ranks and new ids live in one list. (An arithmetic, branch-free min was
// measured slower than the compiler's compare and branch.)
func mergeRanked(m *bpeModel, syms []uint32, merges []uint64) []uint32 {
	n := len(syms)
	merges = merges[:n]
	for n > 1 {
		best := ^uint64(0)
		for i, v := range merges[:n-1] {
			best = min(best, v&^0xFFFFFFFF|uint64(i))
		}
		if best>>32 == uint64(noRank) {
			break
		}
		bi := int(uint32(best))
		syms[bi] = uint32(merges[bi])
		// Shift the tail left by one in a plain loop: the lists are short,
		// and a call to memmove per list costs more than the moves.
		for i := bi + 1; i < n-1; i++ {
			syms[i] = syms[i+1]
		}
		for i := bi + 1; i < n-2; i++ {
			merges[i] = merges[i+1]
		}
		n--
		if bi > 0 {
			merges[bi-1] = m.pairValue(syms[bi-1], syms[bi])
		}
		if bi < n-1 {
			merges[bi] = m.pairValue(syms[bi], syms[bi+1])
		}
	}
	return syms[:n]
}

func grow(b []uint32, n int) []uint32 {
	if cap(b) < n {
		return make([]uint32, n, n*2)
	}
	return b[:n]
}

func grow64(b []uint64, n int) []uint64 {
	if cap(b) < n {
		return make([]uint64, n, n*2)
	}
	return b[:n]
}
