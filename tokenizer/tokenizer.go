// Package tokenizer turns text into the exact token ids a Hugging Face
// tokenizer (and so vLLM or SGLang) would produce, in pure Go.
//
// It loads a tokenizer.json (BPE models, byte-level or SentencePiece-style
// with byte fallback), runs the same pipeline as the Rust tokenizers library
// — added-token extraction, normalizers, pre-tokenizers, the BPE model and
// post-processors — and decodes ids back to text. The chat-template half of
// the package renders OpenAI chat requests into prompts before encoding.
//
// It also holds kvroute's one model of an OpenAI request (Request): the
// body decoded once with the templates' own JSON value type (ParseRequest)
// into the fields the router reads, the prompt or prompts of a completion,
// and the chat as vLLM normalizes it for the template (Request.Chat), image
// parts included, each with its place in the body. The picker, the
// multimodal encoder and the render service all read that one value.
//
// A Tokenizer is immutable after loading and safe for concurrent use.
package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// AddedToken is one entry of tokenizer.json's added_tokens: a string that is
// matched before normalization and pre-tokenization and maps to one id.
type AddedToken struct {
	// ID is the token id.
	ID uint32
	// Content is the token's text, e.g. "<|eot_id|>".
	Content string
	// Special marks control tokens (BOS, EOS, turn markers).
	Special bool
	// LStrip makes a match swallow the whitespace on its left.
	LStrip bool
	// RStrip makes a match swallow the whitespace on its right.
	RStrip bool
	// SingleWord only matches the token when it is not part of a word.
	SingleWord bool
	// Normalized matches the token against normalized text instead of raw text.
	Normalized bool
}

// Tokenizer encodes text to token ids and decodes ids to text. It is
// immutable after Load and safe for concurrent use.
type Tokenizer struct {
	added      *addedVocab
	normalizer normalizer // nil when the file has none
	pre        *preChain  // nil when the file has none
	model      *bpeModel
	post       postProcessor // nil when the file has none
	decoder    decoder       // nil when the file has none
}

// Load reads dir/tokenizer.json. The chat-template settings in
// dir/tokenizer_config.json are read by the chat half of this package.
func Load(dir string) (*Tokenizer, error) {
	return LoadFile(filepath.Join(dir, "tokenizer.json"))
}

// LoadFile reads a tokenizer.json file. A file that uses a component this
// package does not implement fails with an error naming that component.
func LoadFile(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read %s: %w", path, err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	return t, nil
}

// Encode returns the token ids of text, as the Hugging Face tokenizer's
// encode(text, add_special_tokens) would. Special tokens written in text are
// always recognised; addSpecialTokens only controls what the post-processor
// adds (e.g. a BOS token). Invalid UTF-8 bytes are each read as U+FFFD, as a
// Go range loop reads them.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	if !utf8.ValidString(text) {
		text = string([]rune(text))
	}
	ids := make([]uint32, 0, len(text)/3+4)
	st := getEncodeState()
	defer putEncodeState(st)
	ids = t.encodeInto(st, text, ids)
	if t.post != nil && addSpecialTokens {
		ids = t.post.process(ids)
	}
	return ids
}

// encodeInto runs added-token extraction, normalization, pre-tokenization and
// the model over text, appending ids to dst.
func (t *Tokenizer) encodeInto(st *encodeState, text string, dst []uint32) []uint32 {
	segs := t.added.split(text, t.added.raw, st.segs[:0], true)
	st.segs = segs
	for _, seg := range segs {
		if seg.id >= 0 {
			dst = append(dst, uint32(seg.id))
			continue
		}
		s := seg.text
		if un, ok := t.normalizer.(unicodeNorm); ok {
			s = un.normalizeScratch(st, s)
		} else if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		if t.added.norm.empty() {
			dst = t.encodeSegment(st, s, seg.first, dst)
			continue
		}
		inner := t.added.split(s, t.added.norm, st.inner[:0], seg.first)
		st.inner = inner
		for _, in := range inner {
			if in.id >= 0 {
				dst = append(dst, uint32(in.id))
				continue
			}
			dst = t.encodeSegment(st, in.text, in.first, dst)
		}
	}
	return dst
}

// encodeSegment pre-tokenizes one normalized segment and runs the model on
// each piece.
func (t *Tokenizer) encodeSegment(st *encodeState, s string, first bool, dst []uint32) []uint32 {
	if s == "" {
		return dst
	}
	if t.pre == nil {
		return t.model.encodePiece(st, s, dst)
	}
	// A single isolating split (Llama 3, Qwen3) or a chain of them with
	// scanners (DeepSeek-V3) streams its pieces straight to the model; the
	// first flag only matters to Metaspace, which such chains have no step
	// of. A byte-level piece is looked up where it lies in s (getAt).
	m := t.model
	raw := m.raw != nil && m.segment == ""
	yield := func(a, b int) {
		// encodeWord for a byte-level piece, looked up where it lies in s
		// and written out here: a method call per piece cost 2-8 % of
		// Encode (seven interleaved rounds).
		switch {
		case !raw:
			dst = m.encodePiece(st, s[a:b], dst)
		case b-a == 1:
			dst = append(dst, m.byteID[s[a]])
		default:
			if id, self, ok := m.raw.getAt(s, a, b); ok && (self || m.ignoreMerges) {
				dst = append(dst, id)
			} else {
				dst = m.mergeWord(st, s[a:b], dst)
			}
		}
	}
	if scan := t.pre.soleIsolate(); scan != nil {
		isolateEach(s, scan, yield)
		return dst
	}
	if iso := t.pre.isolators; iso != nil {
		isolateChainEach(s, iso, yield)
		return dst
	}
	pieces := t.pre.run(st, piece{text: s, first: first})
	for _, p := range pieces {
		dst = t.model.encodePiece(st, p.text, dst)
	}
	return dst
}

// WithPieceCache returns a tokenizer that shares t's vocabulary and pipeline
// but has its own piece cache of the given number of slots (rounded up to a
// power of two); slots <= 0 turns the cache off. The piece cache remembers
// the ids of pieces that needed BPE merges (one entry per slot, a colliding
// piece replacing the older one), so repeated words skip the merges; it is
// shared by concurrent encodes without a lock. A loaded tokenizer has
// DefaultPieceCacheSlots slots (fewer for a vocabulary below that size).
func (t *Tokenizer) WithPieceCache(slots int) *Tokenizer {
	m := *t.model
	m.cache = newPieceCache(slots)
	c := *t
	c.model = &m
	return &c
}

// Decode turns ids back into text through the file's decoder, keeping
// special tokens. Ids the tokenizer does not know are skipped.
func (t *Tokenizer) Decode(ids []uint32) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if s, ok := t.TokenString(id); ok {
			tokens = append(tokens, s)
		}
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decode(tokens), "")
}

// TokenID returns the id of a token string (an added token or a vocabulary
// entry, written as the vocabulary writes it, e.g. "Ġthe" for byte-level BPE).
func (t *Tokenizer) TokenID(s string) (uint32, bool) {
	if tok, ok := t.added.byContent[s]; ok {
		return tok.ID, true
	}
	id, ok := t.model.vocab[s]
	return id, ok
}

// TokenString returns the string of a token id as the vocabulary writes it.
// For an added token with normalized=true it is the normalized content, as
// the reference's id_to_token returns it.
func (t *Tokenizer) TokenString(id uint32) (string, bool) {
	if s, ok := t.added.idString[id]; ok {
		return s, true
	}
	if int(id) < len(t.model.tokens) && t.model.hasToken[id] {
		return t.model.tokens[id], true
	}
	return "", false
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id uint32) bool {
	tok, ok := t.added.byID[id]
	return ok && tok.Special
}

// SpecialTokens returns a copy of every added token (special or not) in the
// order the file lists them, with their ids and flags. IDs are the ones the
// reference assigns when it loads the file, which match the file's own for
// every file the reference wrote.
func (t *Tokenizer) SpecialTokens() []AddedToken {
	out := make([]AddedToken, len(t.added.tokens))
	copy(out, t.added.tokens)
	return out
}

// VocabSize returns one more than the largest token id the tokenizer knows.
func (t *Tokenizer) VocabSize() int {
	n := len(t.model.tokens)
	for _, tok := range t.added.tokens {
		if int(tok.ID) >= n {
			n = int(tok.ID) + 1
		}
	}
	return n
}
