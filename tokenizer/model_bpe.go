package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"-"` // read by jsonScanner
	Merges                  []mergeJSON       `json:"-"` // read by jsonScanner
}

// mergeJSON is one merge rule, written either as "a b" or as ["a", "b"].
type mergeJSON struct{ a, b []byte }

// parseModel builds the BPE model. byteLevel says the pre-tokenizer chain
// ends with ByteLevel, which lets the model run on raw bytes.
func parseModel(j bpeJSON, byteLevel bool) (*bpeModel, error) {
	if j.Type == "" && j.Merges != nil {
		j.Type = "BPE"
	}
	if j.Type != "BPE" {
		return nil, fmt.Errorf("unsupported model type %q (only BPE is implemented)", j.Type)
	}
	if j.Dropout != nil && *j.Dropout != 0 {
		return nil, fmt.Errorf("unsupported BPE dropout %v (encoding would not be deterministic)", *j.Dropout)
	}
	if len(j.Vocab) == 0 {
		return nil, errors.New("BPE vocab is empty")
	}
	m := &bpeModel{
		vocab:        j.Vocab,
		ignoreMerges: j.IgnoreMerges,
		byteFallback: j.ByteFallback,
		fuseUnk:      j.FuseUnk,
		unk:          -1,
		cache:        newPieceCache(min(DefaultPieceCacheSlots, max(1024, len(j.Vocab)))),
	}
	if j.ContinuingSubwordPrefix != nil {
		m.prefix = *j.ContinuingSubwordPrefix
	}
	if j.EndOfWordSuffix != nil {
		m.suffix = *j.EndOfWordSuffix
	}
	maxID := uint32(0)
	for _, id := range j.Vocab {
		maxID = max(maxID, id)
	}
	if maxID > 1<<26 {
		return nil, fmt.Errorf("BPE vocab id %d is implausibly large", maxID)
	}
	m.tokens = make([]string, maxID+1)
	m.hasToken = make([]bool, maxID+1)
	for s, id := range j.Vocab {
		m.tokens[id] = s
		m.hasToken[id] = true
	}
	if j.UnkToken != nil {
		id, ok := j.Vocab[*j.UnkToken]
		if !ok {
			return nil, fmt.Errorf("BPE unk_token %q is not in the vocab", *j.UnkToken)
		}
		m.unk = int64(id)
	}
	for b := 0; b < 256; b++ {
		m.fallbackID[b] = -1
		if id, ok := j.Vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackID[b] = int64(id)
		}
	}
	m.merges = newPairTable(len(j.Merges))
	var buf []byte
	for rank, mg := range j.Merges {
		a, ok := j.Vocab[string(mg.a)]
		if !ok {
			return nil, fmt.Errorf("BPE merge %d (%q %q): %q is not in the vocab", rank, mg.a, mg.b, mg.a)
		}
		b, ok := j.Vocab[string(mg.b)]
		if !ok {
			return nil, fmt.Errorf("BPE merge %d (%q %q): %q is not in the vocab", rank, mg.a, mg.b, mg.b)
		}
		right := mg.b
		if m.prefix != "" {
			right = bytes.TrimPrefix(right, []byte(m.prefix))
		}
		buf = append(append(buf[:0], mg.a...), right...)
		nid, ok := j.Vocab[string(buf)]
		if !ok {
			return nil, fmt.Errorf("BPE merge %d (%q %q): %q is not in the vocab", rank, mg.a, mg.b, buf)
		}
		m.merges.put(uint64(a)<<32|uint64(b), uint64(rank)<<32|uint64(nid))
	}
	m.merges.seal()
	if byteLevel && m.prefix == "" && m.suffix == "" {
		m.setupByteMode()
	}
	if !m.byteMode && !m.ignoreMerges && m.prefix == "" && m.suffix == "" {
		m.segment = segmentMarker(m.vocab, "▁")
	}
	if !m.byteMode && m.prefix == "" && m.suffix == "" {
		m.charID = make([]int32, 0x10000)
		for i := range m.charID {
			m.charID[i] = -1
		}
		for tok, id := range m.vocab {
			if r, n := utf8.DecodeRuneInString(tok); n == len(tok) && r < 0x10000 && r != utf8.RuneError && id <= 1<<31-1 {
				m.charID[r] = int32(id)
			}
		}
	}
	return m, nil
}

// segmentMarker returns marker if it is in the vocabulary and no token has
// it after a different character, so no merge can join text across a
// boundary in front of a run of markers; otherwise "".
func segmentMarker(vocab map[string]uint32, marker string) string {
	if _, ok := vocab[marker]; !ok {
		return ""
	}
	for tok := range vocab {
		rest := tok
		for strings.HasPrefix(rest, marker) {
			rest = rest[len(marker):]
		}
		if strings.Contains(rest, marker) {
			return ""
		}
	}
	return marker
}

// setupByteMode switches the model to raw bytes when every byte has a token.
func (m *bpeModel) setupByteMode() {
	for b := 0; b < 256; b++ {
		id, ok := m.vocab[byteToStr[b]]
		if !ok {
			return
		}
		m.byteID[b] = id
	}
	m.byteMode = true
	m.bytePair = new([1 << 16]uint64)
	for a := 0; a < 256; a++ {
		for b := 0; b < 256; b++ {
			v, ok := m.merges.get(uint64(m.byteID[a])<<32 | uint64(m.byteID[b]))
			if !ok {
				v = uint64(noRank) << 32
			}
			m.bytePair[a<<8|b] = v
		}
	}
	m.setupChars()
	var self func(string, uint32) bool
	if !m.ignoreMerges {
		st := &encodeState{}
		self = func(raw string, id uint32) bool {
			var syms []uint32
			if len(raw) > heapThreshold {
				syms = st.syms[:0]
				for i := 0; i < len(raw); i++ {
					syms = append(syms, m.byteID[raw[i]])
				}
				syms = m.mergeHeap(st, syms)
			} else {
				syms = m.mergeBytes(st, raw)
			}
			st.syms = syms[:0]
			return len(syms) == 1 && syms[0] == id
		}
	}
	m.raw = newRawVocab(m.vocab, self)
}
