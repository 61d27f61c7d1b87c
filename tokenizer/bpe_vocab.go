package tokenizer

import (
	"hash/maphash"
	"math/bits"
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
		if len(raw) > rawMaxLen || len(arena)+len(raw) >= rawMaxOff {
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
	return v
}

// rawHead packs the first 8 bytes of s.
func rawHead(s string) uint64 {
	var w uint64
	for k := 0; k < len(s) && k < 8; k++ {
		w |= uint64(s[k]) << (8 * k)
	}
	return w
}

func (v *rawVocab) hash(s string, head uint64) uint64 {
	if len(s) > 8 {
		return maphash.String(v.seed, s)
	}
	hi, lo := bits.Mul64(head^uint64(len(s))<<59, 0x9e3779b97f4a7c15)
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
	for i := v.hash(raw, head) & v.mask; ; i = (i + 1) & v.mask {
		s := &v.slots[i]
		if s.meta == 0 {
			break
		}
		if s.head == head && int(s.meta&0xFF) == len(raw) {
			if len(raw) > 8 {
				off := s.meta >> 9
				if v.bytes[off:off+uint32(len(raw)-8)] != raw[8:] {
					continue
				}
			}
			return s.id, s.meta&(1<<8) != 0, true
		}
	}
	if v.long != nil {
		l, ok := v.long[raw]
		return l.id, l.self, ok
	}
	return 0, false, false
}
