package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// segment is a stretch of text between added tokens, or one added token
// (id >= 0). first marks the segment that starts the original text.
type segment struct {
	text  string
	id    int64
	first bool
}

// addedVocab holds the added tokens and the two matchers the reference uses:
// raw for tokens matched on the input as written, norm for tokens with
// normalized=true, matched on normalized text.
type addedVocab struct {
	tokens    []AddedToken
	byContent map[string]AddedToken
	byID      map[uint32]AddedToken
	idString  map[uint32]string // what TokenString and Decode see
	raw       *tokenTrie
	norm      *tokenTrie
}

// newAddedVocab registers the added tokens as the reference does when it
// loads a file: one at a time in file order, each taking its id from earlier
// added tokens or the model's vocabulary when its content is already there,
// and otherwise the next free id after the vocabulary. The ids written in the
// file are only what the reference expects; for files it wrote they agree.
func newAddedVocab(list []addedTokenJSON, n normalizer, m *bpeModel) (*addedVocab, error) {
	v := &addedVocab{
		byContent: make(map[string]AddedToken, len(list)),
		byID:      make(map[uint32]AddedToken, len(list)),
		idString:  make(map[uint32]string, len(list)),
		raw:       &tokenTrie{},
		norm:      &tokenTrie{},
	}
	vocabSize := int64(len(m.vocab))
	maxID := int64(-1)
	seen := make(map[AddedToken]bool, len(list))
	for _, j := range list {
		if j.Content == "" {
			continue
		}
		tok := AddedToken{Content: j.Content, Special: j.Special, LStrip: j.LStrip,
			RStrip: j.RStrip, SingleWord: j.SingleWord, Normalized: j.Normalized}
		if seen[tok] {
			continue
		}
		seen[tok] = true
		var id int64
		if prev, ok := v.byContent[tok.Content]; ok {
			id = int64(prev.ID)
		} else if vid, ok := m.vocab[tok.Content]; ok {
			id = int64(vid)
		} else if maxID >= vocabSize || (maxID >= 0 && vocabSize == 0) {
			id = maxID + 1
		} else {
			id = vocabSize
		}
		if id > 1<<32-1 {
			return nil, fmt.Errorf("added token %q: id overflow", tok.Content)
		}
		tok.ID = uint32(id)
		maxID = max(maxID, id)
		v.tokens = append(v.tokens, tok)
		v.byContent[tok.Content] = tok
		v.byID[tok.ID] = tok
		// The reference hands normalized tokens to the decoder in their
		// normalized form (e.g. "▁hello▁world"), so the decoder spaces them.
		v.idString[tok.ID] = tok.Content
		if tok.Normalized && n != nil {
			v.idString[tok.ID] = n.normalize(tok.Content)
		}
	}
	for _, tok := range v.byContent {
		if tok.Normalized {
			pattern := tok.Content
			if n != nil {
				pattern = n.normalize(pattern)
			}
			v.norm.insert(pattern, tok)
		} else {
			v.raw.insert(tok.Content, tok)
		}
	}
	return v, nil
}

// split cuts s at the tokens of trie, applying each token's single_word,
// lstrip and rstrip rules, and appends the segments to dst. Matches are
// found leftmost-longest and never overlap.
func (v *addedVocab) split(s string, trie *tokenTrie, dst []segment, first bool) []segment {
	if trie.empty() {
		return append(dst, segment{text: s, id: -1, first: first})
	}
	// When every pattern starts with the same byte (often '<'), jump to
	// its next occurrence with IndexByte instead of testing every byte.
	only := -1
	if root := trie.nodes[0].edges; len(root) == 1 {
		only = int(root[0].b)
	}
	startOffset := 0
	for i := 0; i < len(s); {
		if only >= 0 {
			k := strings.IndexByte(s[i:], byte(only))
			if k < 0 {
				break
			}
			i += k
		} else if !trie.firstByte[s[i]] {
			i++
			continue
		}
		end, tok, ok := trie.longest(s, i)
		if !ok {
			i++
			continue
		}
		start, stop := i, end
		i = end
		if tok.SingleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.LStrip {
			start = max(leftmostSpaceAtEnd(s[:start]), startOffset)
		}
		if tok.RStrip {
			stop += rightmostSpaceAtStart(s[stop:])
		}
		start = max(start, startOffset)
		if startOffset < start {
			dst = append(dst, segment{text: s[startOffset:start], id: -1, first: first && startOffset == 0})
		}
		dst = append(dst, segment{text: s[start:stop], id: int64(tok.ID), first: first && start == 0})
		startOffset = stop
		i = max(i, stop)
	}
	if startOffset < len(s) || len(s) == 0 {
		dst = append(dst, segment{text: s[startOffset:], id: -1, first: first && startOffset == 0})
	}
	return dst
}

// isWordRune is the \w class of the reference's regex engine.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D || unicode.Is(unicode.Nl, r)
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}

// leftmostSpaceAtEnd returns where the run of whitespace ending s begins.
func leftmostSpaceAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// rightmostSpaceAtStart returns the byte length of the whitespace opening s.
func rightmostSpaceAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}

// tokenTrie is a byte trie over added-token patterns.
type tokenTrie struct {
	nodes     []trieNode
	firstByte [256]bool
}

type trieNode struct {
	edges []trieEdge
	tok   AddedToken
	term  bool
}

type trieEdge struct {
	b  byte
	to int32
}

func (t *tokenTrie) empty() bool { return len(t.nodes) == 0 }

func (t *tokenTrie) insert(pattern string, tok AddedToken) {
	if pattern == "" {
		return
	}
	if len(t.nodes) == 0 {
		t.nodes = append(t.nodes, trieNode{})
	}
	t.firstByte[pattern[0]] = true
	cur := int32(0)
	for i := 0; i < len(pattern); i++ {
		nxt := t.child(cur, pattern[i])
		if nxt < 0 {
			t.nodes = append(t.nodes, trieNode{})
			nxt = int32(len(t.nodes) - 1)
			t.nodes[cur].edges = append(t.nodes[cur].edges, trieEdge{b: pattern[i], to: nxt})
		}
		cur = nxt
	}
	t.nodes[cur].tok = tok
	t.nodes[cur].term = true
}

func (t *tokenTrie) child(n int32, b byte) int32 {
	for _, e := range t.nodes[n].edges {
		if e.b == b {
			return e.to
		}
	}
	return -1
}

// longest returns the end of the longest pattern starting at s[i:].
func (t *tokenTrie) longest(s string, i int) (int, AddedToken, bool) {
	cur := int32(0)
	end := -1
	var tok AddedToken
	for j := i; j < len(s); j++ {
		cur = t.child(cur, s[j])
		if cur < 0 {
			break
		}
		if t.nodes[cur].term {
			end, tok = j+1, t.nodes[cur].tok
		}
	}
	return end, tok, end >= 0
}
