package tokenizer

import (
	"cmp"
	"hash/maphash"
	"math/bits"
	"slices"
)

// rawVocab maps the raw bytes of a byte-level model's tokens to their ids,
// so that a piece is looked up as the pre-tokenizer cut it: no re-encoding
// into the byte-level alphabet and no Go map. It is an open-addressing table
// (linear probing, power-of-two size, at most 5/8 full) of 16-byte slots
// that hold a token's first 8 bytes, so most lookups touch one cache line
// and compare one word; longer tokens compare their rest in one string of
// every token's bytes. It is built once at load and read-only afterwards, so
// concurrent lookups need no lock.
type rawVocab struct {
	seed  maphash.Seed
	mask  uint64
	slots []rawVocabSlot
	bytes string // the tokens' bytes, back to back
	// long holds the rare tokens too long for a slot, by their bytes.
	long map[string]rawLong
	// hot is a small direct-mapped copy of the slots of the lowest-id tokens
	// of at most 8 bytes, the most frequent merges, so that most lookups hit
	// a table that stays in the CPU's cache; a miss goes on to slots.
	hot     []rawVocabSlot
	hotMask uint64
}

type rawVocabSlot struct {
	head uint64 // the first 8 bytes, little-endian, zero-padded
	id   uint32
	meta uint32 // off<<9 | self<<8 | len; 0 when the slot is empty
}

type rawLong struct {
	id   uint32
	self bool
}

const (
	rawMaxLen = 255     // longest token held in a slot
	rawMaxOff = 1 << 23 // bytes addressable by a slot
)

// newRawVocab indexes the tokens of vocab (written in the byte-level
// alphabet) by their bytes. Tokens outside the alphabet cannot be the
// spelling of any piece and are left out. self reports the tokens whose
// bytes the model's merges turn back into them.
func newRawVocab(vocab map[string]uint32, self func(raw string, id uint32) bool) *rawVocab {
	size := 1
	for size*5/8 < len(vocab) {
		size <<= 1
	}
	v := &rawVocab{seed: maphash.MakeSeed(), mask: uint64(size - 1), slots: make([]rawVocabSlot, size)}
	// Every token's bytes, decoded into one string: ends[k] is where token
	// k's bytes end.
	var buf []byte
	var ends []int
	var ids []uint32
	for tok, id := range vocab {
		n := len(buf)
		var ok bool
		if buf, ok = appendByteLevelDecoded(buf, tok); !ok || len(buf) == n {
			buf = buf[:n]
			continue
		}
		ends = append(ends, len(buf))
		ids = append(ids, id)
	}
	all := string(buf)
	var arena []byte
	start := 0
	for k, end := range ends {
		raw := all[start:end]
		start = end
		isSelf := self != nil && self(raw, ids[k])
		if len(raw) > rawMaxLen || (len(raw) > 8 && len(arena)+len(raw)-8 >= rawMaxOff) {
			if v.long == nil {
				v.long = map[string]rawLong{}
			}
			v.long[raw] = rawLong{ids[k], isSelf}
			continue
		}
		meta := uint32(len(arena))<<9 | uint32(len(raw))
		if isSelf {
			meta |= 1 << 8
		}
		if len(raw) > 8 {
			arena = append(arena, raw[8:]...)
		}
		v.insert(raw, rawVocabSlot{head: rawHead(raw), id: ids[k], meta: meta})
	}
	v.bytes = string(arena)
	v.buildHot()
	return v
}

// rawHotSlots is the size of the hot table: 16 Ki slots of 16 bytes.
const rawHotSlots = 1 << 14

// buildHot fills the hot table with short tokens in id order, a token
// taking its slot only when no lower id holds it.
func (v *rawVocab) buildHot() {
	v.hot = make([]rawVocabSlot, rawHotSlots)
	v.hotMask = rawHotSlots - 1
	short := make([]rawVocabSlot, 0, len(v.slots))
	for _, s := range v.slots {
		if s.meta != 0 && s.meta&0xFF <= 8 {
			short = append(short, s)
		}
	}
	slices.SortFunc(short, func(a, b rawVocabSlot) int { return cmp.Compare(a.id, b.id) })
	for _, s := range short {
		h := v.hashHead(s.head, int(s.meta&0xFF)) & v.hotMask
		if v.hot[h].meta == 0 {
			v.hot[h] = s
		}
	}
}

// rawHead packs the first 8 bytes of s, zero-padded. It uses at most two
// overlapping loads instead of a loop, so that it costs the same few
// instructions for every length and branches on length classes only.
func rawHead(s string) uint64 {
	switch n := len(s); {
	case n >= 8:
		return load64(s)
	case n >= 4:
		return uint64(load32(s)) | uint64(load32(s[n-4:]))<<(8*(n-4))
	case n >= 2:
		return uint64(load16(s)) | uint64(load16(s[n-2:]))<<(8*(n-2))
	case n == 1:
		return uint64(s[0])
	}
	return 0
}

// load64, load32 and load16 read the first bytes of s little-endian; each
// compiles to one load.
func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func load32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

func load16(s string) uint16 {
	_ = s[1]
	return uint16(s[0]) | uint16(s[1])<<8
}

func (v *rawVocab) hash(s string, head uint64) uint64 {
	if len(s) > 8 {
		return maphash.String(v.seed, s)
	}
	return v.hashHead(head, len(s))
}

func (v *rawVocab) hashHead(head uint64, n int) uint64 {
	hi, lo := bits.Mul64(head^uint64(n)<<59, 0x9e3779b97f4a7c15)
	return hi ^ lo
}

func (v *rawVocab) insert(raw string, s rawVocabSlot) {
	for i := v.hash(raw, s.head) & v.mask; ; i = (i + 1) & v.mask {
		if v.slots[i].meta == 0 {
			v.slots[i] = s
			return
		}
	}
}

// get returns the id of the token whose bytes are raw and whether merging
// those bytes gives that token back.
func (v *rawVocab) get(raw string) (id uint32, self, ok bool) {
	if len(raw) > rawMaxLen || raw == "" {
		l, ok := v.long[raw]
		return l.id, l.self, ok
	}
	head := rawHead(raw)
	if len(raw) <= 8 {
		return v.getShort(head, len(raw))
	}
	for i := maphash.String(v.seed, raw) & v.mask; ; i = (i + 1) & v.mask {
		s := &v.slots[i]
		if s.meta == 0 {
			break
		}
		if s.head == head && int(s.meta&0xFF) == len(raw) {
			off := s.meta >> 9
			if v.bytes[off:off+uint32(len(raw)-8)] == raw[8:] {
				return s.id, s.meta&(1<<8) != 0, true
			}
		}
	}
	if v.long != nil {
		l, ok := v.long[raw]
		return l.id, l.self, ok
	}
	return 0, false, false
}

// getShort looks up a token of n bytes, 1 to 8, by its head: the hot table
// first, then the slots. Such tokens are never in long.
func (v *rawVocab) getShort(head uint64, n int) (id uint32, self, ok bool) {
	h := v.hashHead(head, n)
	if s := &v.hot[h&v.hotMask]; s.head == head && int(s.meta&0xFF) == n {
		return s.id, s.meta&(1<<8) != 0, true
	}
	for i := h & v.mask; ; i = (i + 1) & v.mask {
		s := &v.slots[i]
		if s.meta == 0 {
			return 0, false, false
		}
		if s.head == head && int(s.meta&0xFF) == n {
			return s.id, s.meta&(1<<8) != 0, true
		}
	}
}

// headMask[n] keeps the first n bytes of a little-endian 8-byte load.
var headMask = [9]uint64{0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF, 0xFFFFFFFFFF, 0xFFFFFFFFFFFF, 0xFFFFFFFFFFFFFF, ^uint64(0)}

// getAt is get(s[a:b]) for a piece cut from s: when the piece is 1 to 8
// bytes and 8 bytes of s can be read from a, its head is one load and a
// mask instead of loads chosen by a branch on its length.
func (v *rawVocab) getAt(s string, a, b int) (id uint32, self, ok bool) {
	if n := b - a; uint(n-1) < 8 && a+8 <= len(s) {
		return v.getShort(load64(s[a:])&headMask[n], n)
	}
	return v.get(s[a:b])
}
