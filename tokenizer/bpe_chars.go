package tokenizer

import "unicode/utf8"

// Whole-character first round (byte mode). Most two- and three-byte UTF-8
// characters are one token, reached by one or two merges of their bytes.
// mergeBytes starts such a character as that token instead of as its bytes,
// which skips those merges and their pair lookups, but only where the
// result is provably the same as merging the bytes.
//
// Why it is the same: run BPE on the character's bytes alone and call the
// rank of its j-th merge r_j, the symbols at its edges before that merge
// L_j and R_j, the final token T and R = max r_j. In a piece, the
// character's bytes merge among themselves in the same order as alone
// (their pairs are the same), and a merge across its edge can only pair a
// neighbour with L_j or R_j. If every merge (y, L_j) that a left neighbour
// y could form has a rank above r_j, and likewise (R_j, y) on the right, no
// merge across the edge can come before the character is whole; if also
// every merge of T with a neighbour ranks above R, then starting from T
// merges everything else in the same order as starting from the bytes.
// Which neighbours are possible is known from the piece's bytes: a left
// neighbour ends with the byte before the character, a right one starts
// with the byte after it. So the conditions are checked, when the model is
// loaded, for each byte a neighbour inside a run of multi-byte characters
// can have there (a continuation byte on the left, a lead byte on the
// right), for a space on the left, and for any neighbour at all.

// charTok entries: the token id in the low bits and these flags. An entry
// without charPresent is a character that is not collapsed.
const (
	charPresent   = 1 << 31
	charLeftAny   = 1 << 30 // safe after any left neighbour
	charLeftSpace = 1 << 29 // safe after a neighbour ending in a space
	charRightAny  = 1 << 28 // safe before any right neighbour
	charTwo       = 1 << 27 // starts as two tokens, the second in charMask
	charIDMask    = 1<<27 - 1
)

// charMask holds, for each character, which neighbour bytes it is safe
// next to: bit k of left for a left neighbour ending in byte 0x80+k, bit k
// of right for a right neighbour starting with byte 0xC0+k; and the second
// token of a character that starts as two (noRank otherwise).
type charMask struct {
	left, right uint64
	second      uint32
}

// setupChars builds charTok and charMasks; the model's merges, byteID and
// tokens must be set. It leaves them nil when ids do not fit the entries.
func (m *bpeModel) setupChars() {
	nv := len(m.tokens)
	if nv > charIDMask {
		return
	}
	// The tokens that can be a character's token or part of one: one to
	// three bytes, all 0x80 or above. Only their merges matter here, so
	// the rank tables below have a row for each of them alone.
	idx := make([]int32, nv)
	k := int32(0)
	var raw []byte
	for id, tok := range m.tokens {
		idx[id] = -1
		var ok bool
		raw, ok = appendByteLevelDecoded(raw[:0], tok)
		if !ok || len(raw) == 0 || len(raw) > 3 {
			continue
		}
		high := true
		for _, c := range raw {
			high = high && c >= 0x80
		}
		if high {
			idx[id] = k
			k++
		}
	}
	// Lowest rank of a merge with the token on its right (minR*) or on its
	// left (minL*): with any partner, a partner ending in a space, in each
	// continuation byte (minRCont[k*64+b-0x80]), or starting with each lead
	// byte (minLLead[k*64+b-0xC0]).
	minRAny, minRSpace, minLAny := rankRow(int(k)), rankRow(int(k)), rankRow(int(k))
	minRCont, minLLead := rankRow(int(k)*64), rankRow(int(k)*64)
	for _, s := range m.merges.slots {
		if s.key == emptyPair {
			continue
		}
		a, b, r := uint32(s.key>>32), uint32(s.key), uint32(s.val>>32)
		if int(a) >= nv || int(b) >= nv {
			return // cannot happen for a parsed model; never guess
		}
		if ka := idx[a]; ka >= 0 {
			minLAny[ka] = min(minLAny[ka], r)
			row := minLLead[int(ka)*64 : int(ka)*64+64]
			if fb, ok := m.tokenByte(b, true); !ok {
				// A partner whose bytes are unknown counts as every byte.
				for c := range row {
					row[c] = min(row[c], r)
				}
			} else if fb >= 0xC0 {
				row[fb-0xC0] = min(row[fb-0xC0], r)
			}
		}
		if kb := idx[b]; kb >= 0 {
			minRAny[kb] = min(minRAny[kb], r)
			row := minRCont[int(kb)*64 : int(kb)*64+64]
			lb, ok := m.tokenByte(a, false)
			if !ok || lb == ' ' {
				minRSpace[kb] = min(minRSpace[kb], r)
			}
			if !ok {
				for c := range row {
					row[c] = min(row[c], r)
				}
			} else if lb >= 0x80 && lb < 0xC0 {
				row[lb-0x80] = min(row[lb-0x80], r)
			}
		}
	}
	m.charTok = make([]uint32, 0x10000)
	m.charMasks = make([]charMask, 0x10000)
	var buf [4]byte
	var syms []uint32
	var left, right []uint32 // the edge symbols before each merge
	var ranks []uint32
	for cp := rune(0x80); cp < 0x10000; cp++ {
		if cp >= 0xD800 && cp < 0xE000 {
			continue
		}
		n := utf8.EncodeRune(buf[:], cp)
		syms, left, right, ranks = syms[:0], left[:0], right[:0], ranks[:0]
		for _, c := range buf[:n] {
			syms = append(syms, m.byteID[c])
		}
		for len(syms) > 1 {
			best, bi, nid := noRank, -1, uint32(0)
			for i := 0; i+1 < len(syms); i++ {
				if r, id := m.pair(syms[i], syms[i+1]); r < best {
					best, bi, nid = r, i, id
				}
			}
			if bi < 0 {
				break
			}
			left, right, ranks = append(left, syms[0]), append(right, syms[len(syms)-1]), append(ranks, best)
			syms[bi] = nid
			syms = append(syms[:bi+1], syms[bi+2:]...)
		}
		// A character that stays two tokens (a rare one, say) starts as
		// those two where the same conditions hold for the token at each
		// edge; they do not merge with each other, or the run above would
		// have merged them.
		if len(ranks) == 0 || len(syms) > 2 || idx[syms[0]] < 0 || idx[syms[len(syms)-1]] < 0 {
			continue
		}
		tl, tr := syms[0], syms[len(syms)-1]
		hi := uint32(0)
		for _, r := range ranks {
			hi = max(hi, r)
		}
		// Every edge's merges with a neighbour must rank above the merge
		// they must not overtake, and the whole token's above all of them.
		ok := true
		for _, e := range left {
			ok = ok && idx[e] >= 0
		}
		for _, e := range right {
			ok = ok && idx[e] >= 0
		}
		if !ok {
			continue
		}
		e := uint32(charPresent) | tl
		mask := charMask{second: noRank}
		if len(syms) == 2 {
			e |= charTwo
			mask.second = tr
		}
		if safeRow(minRAny, 1, idx, left, ranks, tl, hi, 0) {
			e |= charLeftAny
		}
		if safeRow(minRSpace, 1, idx, left, ranks, tl, hi, 0) {
			e |= charLeftSpace
		}
		if safeRow(minLAny, 1, idx, right, ranks, tr, hi, 0) {
			e |= charRightAny
		}
		mask.left = safeBytes(minRCont, idx, left, ranks, tl, hi)
		mask.right = safeBytes(minLLead, idx, right, ranks, tr, hi)
		m.charTok[cp] = e
		m.charMasks[cp] = mask
	}
}

// safeRow reports whether table's entry c of each edge's row ranks above
// that edge's merge, and of t's row above hi (rows of width entries).
func safeRow(table []uint32, width int, idx []int32, edges, ranks []uint32, t, hi uint32, c int) bool {
	for j, e := range edges {
		if table[int(idx[e])*width+c] <= ranks[j] {
			return false
		}
	}
	return table[int(idx[t])*width+c] > hi
}

// safeBytes is safeRow for each of the 64 entries of rows of 64, as a mask.
func safeBytes(table []uint32, idx []int32, edges, ranks []uint32, t, hi uint32) uint64 {
	mask := ^uint64(0)
	for j, e := range edges {
		row := table[int(idx[e])*64:][:64]
		for c, r := range row {
			if r <= ranks[j] {
				mask &^= 1 << c
			}
		}
	}
	for c, r := range table[int(idx[t])*64:][:64] {
		if r <= hi {
			mask &^= 1 << c
		}
	}
	return mask
}

func rankRow(n int) []uint32 {
	r := make([]uint32, n)
	for i := range r {
		r[i] = noRank
	}
	return r
}

// tokenByte returns the first (or last) raw byte of token id, false when
// the token is not spelled in the byte-level alphabet.
func (m *bpeModel) tokenByte(id uint32, first bool) (byte, bool) {
	tok := m.tokens[id]
	var r rune
	if first {
		r, _ = utf8.DecodeRuneInString(tok)
	} else {
		r, _ = utf8.DecodeLastRuneInString(tok)
	}
	if tok == "" || r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
		return 0, false
	}
	return byte(runeToByte[r]), true
}

// wholeChar returns the token that the character starting at s[i] may
// start as (see above), the second token when it starts as two (else
// noRank), and its length in bytes; or a length of 0.
func (m *bpeModel) wholeChar(s string, i int) (uint32, uint32, int) {
	var cp uint32
	var n int
	switch c := s[i]; {
	case c >= 0xC2 && c < 0xE0 && i+1 < len(s) && s[i+1]&0xC0 == 0x80:
		cp, n = uint32(c&0x1F)<<6|uint32(s[i+1]&0x3F), 2
	case c >= 0xE0 && c < 0xF0 && i+2 < len(s) && s[i+1]&0xC0 == 0x80 && s[i+2]&0xC0 == 0x80:
		cp, n = uint32(c&0x0F)<<12|uint32(s[i+1]&0x3F)<<6|uint32(s[i+2]&0x3F), 3
		if cp < 0x800 { // overlong
			return 0, 0, 0
		}
	default:
		return 0, 0, 0
	}
	e := m.charTok[cp]
	if e&charPresent == 0 {
		return 0, 0, 0
	}
	if i > 0 {
		switch b := s[i-1]; {
		case b&0xC0 == 0x80:
			if m.charMasks[cp].left&(1<<(b&0x3F)) == 0 {
				return 0, 0, 0
			}
		case b == ' ':
			if e&charLeftSpace == 0 {
				return 0, 0, 0
			}
		case e&charLeftAny == 0:
			return 0, 0, 0
		}
	}
	if j := i + n; j < len(s) {
		switch b := s[j]; {
		case b >= 0xC0:
			if m.charMasks[cp].right&(1<<(b&0x3F)) == 0 {
				return 0, 0, 0
			}
		case e&charRightAny == 0:
			return 0, 0, 0
		}
	}
	second := noRank
	if e&charTwo != 0 {
		second = m.charMasks[cp].second
	}
	return e & charIDMask, second, n
}
