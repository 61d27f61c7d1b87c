package tokenizer

import "hash/maphash"

// rawVocab maps the raw bytes of a byte-level model's tokens to their ids,
// so that a piece is looked up as the pre-tokenizer cut it: no re-encoding
// into the byte-level alphabet and no Go map. It is an open-addressing table
// of 16-byte slots (linear probing, power-of-two size, at most 5/8 full)
// over one string holding every token's bytes. It is built once at load and
// read-only afterwards, so concurrent lookups need no lock.
type rawVocab struct {
	seed  maphash.Seed
	mask  uint64
	slots []rawVocabSlot
	bytes string // the tokens' bytes, back to back
}

type rawVocabSlot struct {
	tag uint32 // high half of the hash, with the low bit set; 0 when empty
	id  uint32
	off uint32 // the token's bytes are bytes[off : off+len]
	len uint32 // low 31 bits: length; top bit: rawSelf
}

// rawSelf marks a token that the model's merges turn its own bytes into,
// so a piece equal to it is that one token with or without ignore_merges.
const rawSelf = 1 << 31

// newRawVocab indexes the tokens of vocab (written in the byte-level
// alphabet) by their bytes. Tokens outside the alphabet cannot be the
// spelling of any piece and are left out. self reports the tokens to mark
// rawSelf.
func newRawVocab(vocab map[string]uint32, self func(raw string, id uint32) bool) *rawVocab {
	size := 1
	for size*5/8 < len(vocab) {
		size <<= 1
	}
	v := &rawVocab{seed: maphash.MakeSeed(), mask: uint64(size - 1), slots: make([]rawVocabSlot, size)}
	buf := make([]byte, 0, len(vocab)*8)
	for tok, id := range vocab {
		n := len(buf)
		var ok bool
		if buf, ok = appendByteLevelDecoded(buf, tok); !ok || len(buf) == n || len(buf) > 1<<30 {
			buf = buf[:n]
			continue
		}
		l := uint32(len(buf) - n)
		if self != nil && self(string(buf[n:]), id) {
			l |= rawSelf
		}
		v.insert(string(buf[n:]), rawVocabSlot{id: id, off: uint32(n), len: l})
	}
	v.bytes = string(buf)
	return v
}

func (v *rawVocab) insert(raw string, s rawVocabSlot) {
	h := maphash.String(v.seed, raw)
	s.tag = uint32(h>>32) | 1
	for i := h & v.mask; ; i = (i + 1) & v.mask {
		if v.slots[i].tag == 0 {
			v.slots[i] = s
			return
		}
	}
}

// get returns the id of the token whose bytes are raw and whether it is
// rawSelf.
func (v *rawVocab) get(raw string) (id uint32, self, ok bool) {
	h := maphash.String(v.seed, raw)
	tag := uint32(h>>32) | 1
	for i := h & v.mask; ; i = (i + 1) & v.mask {
		s := &v.slots[i]
		if s.tag == 0 {
			return 0, false, false
		}
		if s.tag == tag && int(s.len&^rawSelf) == len(raw) && v.bytes[s.off:s.off+uint32(len(raw))] == raw {
			return s.id, s.len&rawSelf != 0, true
		}
	}
}
