package tokenizer

import (
	"container/list"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// PrefixCache makes re-encoding a growing conversation cheap. Multi-turn
// chats resend every earlier turn, so most of each prompt was encoded before.
//
// The cache cuts rendered text into chunks that end just after a boundary
// token: an added special token (matched on raw text, without lstrip, rstrip
// or single_word) such as <|eot_id|> or <|im_end|>. Added tokens are split out
// of the text before anything else runs, and the text between them is
// normalized, pre-tokenized and merged on its own, so the ids of a chunk
// depend only on the chunk's text and the token that precedes it — provided
// that no added token occurrence straddles either end of the boundary token,
// which is checked on the actual text. Each chunk after the first is encoded
// as "previous boundary token + chunk" and the leading id dropped, so that
// components which treat the start of the input specially (Metaspace's
// prepend_scheme "first") see the chunk exactly as they see it inside the
// whole prompt. Chunks are keyed by a 128-bit hash of that text; the ids of a
// cached chunk are reused verbatim.
//
// The result is identical to Tokenizer.Encode(text, false), which the tests
// check over many random conversations. A PrefixCache is safe for concurrent
// use; it evicts least recently used chunks past its byte bound.
type PrefixCache struct {
	tok      *Tokenizer
	bounds   *boundaryTokens
	maxBytes int

	mu    sync.Mutex
	bytes int
	lru   *list.List // of *chunkEntry, most recent at the front
	byKey map[cacheKey]*list.Element

	hits, misses, fallbacks atomic.Uint64
}

type cacheKey struct{ a, b uint64 }

type chunkEntry struct {
	key cacheKey
	ids []uint32
}

// entryOverhead approximates the bytes an entry costs beyond its ids.
const entryOverhead = 96

// cacheSeed is random per process so that colliding chunks cannot be
// prepared in advance.
var cacheSeed = rand.Uint64()

// NewPrefixCache returns a cache holding at most maxBytes of chunk ids.
func NewPrefixCache(tok *Tokenizer, maxBytes int) *PrefixCache {
	return &PrefixCache{
		tok:      tok,
		bounds:   newBoundaryTokens(tok),
		maxBytes: maxBytes,
		lru:      list.New(),
		byKey:    map[cacheKey]*list.Element{},
	}
}

// CacheStats counts chunk lookups.
type CacheStats struct {
	// Hits and Misses count chunks found and not found.
	Hits, Misses uint64
	// Fallbacks counts prompts encoded whole because a chunk did not start
	// with its lead token as expected (never seen with real tokenizers).
	Fallbacks uint64
	// Bytes is the memory the cached ids take, approximately.
	Bytes int
	// Entries is the number of cached chunks.
	Entries int
}

// Stats reports the cache's counters.
func (c *PrefixCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Fallbacks: c.fallbacks.Load(),
		Bytes: c.bytes, Entries: c.lru.Len()}
}

// Encode returns Tokenizer.Encode(text, false), reusing cached chunks.
func (c *PrefixCache) Encode(text string) []uint32 { return c.AppendEncode(nil, text) }

// AppendEncode appends Encode(text) to dst and returns the extended slice.
// A caller that only reads the ids (to hash them into blocks) can reuse one
// buffer across requests instead of allocating ~4 bytes per token each time.
func (c *PrefixCache) AppendEncode(dst []uint32, text string) []uint32 {
	ids, _ := c.appendEncode(nil, dst, text)
	return ids
}

// appendEncode is AppendEncode that stops with done's error, checked
// between chunks (one chunk per chat message), when done is not nil.
func (c *PrefixCache) appendEncode(done func() error, dst []uint32, text string) ([]uint32, error) {
	cuts := c.bounds.cuts(text)
	if len(cuts) == 0 {
		return appendIDs(dst, c.tok.Encode(text, false)), nil
	}
	// The chunks' ids are gathered first so that the result is allocated
	// once at its exact size: a guess from the text length overshoots by
	// about half for English prose, on the router's largest allocation.
	var stack [16][]uint32
	parts, n := stack[:0], 0
	start, lead, leadID := 0, "", uint32(0)
	for i := 0; i <= len(cuts); i++ {
		end := len(text)
		if i < len(cuts) {
			end = cuts[i].end
		}
		if end == start {
			continue
		}
		if done != nil {
			if err := done(); err != nil {
				return dst, err
			}
		}
		ids, ok := c.chunk(lead, leadID, text[start:end])
		if !ok {
			c.fallbacks.Add(1)
			return appendIDs(dst, c.tok.Encode(text, false)), nil
		}
		parts, n = append(parts, ids), n+len(ids)
		if i < len(cuts) {
			start, lead, leadID = end, cuts[i].content, cuts[i].id
		}
	}
	dst = slices.Grow(dst, n)
	for _, ids := range parts {
		dst = append(dst, ids...)
	}
	return dst, nil
}

// appendIDs appends ids, a fresh slice, to dst; with no dst it is the result.
func appendIDs(dst, ids []uint32) []uint32 {
	if dst == nil {
		return ids
	}
	return append(dst, ids...)
}

// chunk returns the ids of body when preceded by the boundary token lead
// (whose id is leadID; "" for the start of the text).
func (c *PrefixCache) chunk(lead string, leadID uint32, body string) ([]uint32, bool) {
	key := chunkKey(lead, leadID, body)
	c.mu.Lock()
	if el, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(el)
		ids := el.Value.(*chunkEntry).ids
		c.mu.Unlock()
		c.hits.Add(1)
		return ids, true
	}
	c.mu.Unlock()
	c.misses.Add(1)

	var ids []uint32
	if lead == "" {
		ids = c.tok.Encode(body, false)
	} else {
		all := c.tok.Encode(lead+body, false)
		if len(all) == 0 || all[0] != leadID {
			return nil, false
		}
		ids = all[1:]
	}
	ids = append([]uint32(nil), ids...) // cached slices are never shared with callers' appends
	c.put(key, ids)
	return ids, true
}

func (c *PrefixCache) put(key cacheKey, ids []uint32) {
	size := 4*len(ids) + entryOverhead
	if size > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[key]; ok {
		return
	}
	c.byKey[key] = c.lru.PushFront(&chunkEntry{key: key, ids: ids})
	c.bytes += size
	for c.bytes > c.maxBytes {
		el := c.lru.Back()
		e := el.Value.(*chunkEntry)
		c.lru.Remove(el)
		delete(c.byKey, e.key)
		c.bytes -= 4*len(e.ids) + entryOverhead
	}
}

// chunkKey hashes body, with the boundary token that precedes it folded into
// the seed (distinct tokens, and the start of the text, give distinct
// seeds). One pass of 128-bit XXH3 replaced two of maphash: the chunk is
// often a whole system prompt, hashed on every request, and XXH3 was ~18x
// faster on a 40 KB one.
func chunkKey(lead string, leadID uint32, body string) cacheKey {
	seed := cacheSeed
	if lead != "" {
		seed ^= uint64(leadID)<<1 | 1
	}
	h := xxh3.HashString128Seed(body, seed)
	return cacheKey{h.Hi, h.Lo}
}

// cut is the end of one boundary token occurrence in a text.
type cut struct {
	end     int
	content string
	id      uint32
}

// boundaryTokens finds the places where a text can be cut without changing
// its tokenization.
type boundaryTokens struct {
	raw      []AddedToken          // every added token matched on raw text
	byText   map[string]AddedToken // boundary candidates by content
	lengths  []int                 // distinct candidate lengths, longest first
	first    [256]bool             // first bytes of candidates
	oneFirst byte                  // the only first byte, when there is one (0 otherwise)
	mu       sync.Mutex
	conflict map[string][]string // per candidate: raw tokens that could overlap it
}

func newBoundaryTokens(tok *Tokenizer) *boundaryTokens {
	b := &boundaryTokens{byText: map[string]AddedToken{}, conflict: map[string][]string{}}
	seenLen := map[int]bool{}
	for _, t := range tok.SpecialTokens() {
		if t.Normalized {
			continue
		}
		b.raw = append(b.raw, t)
		last := t.Content[len(t.Content)-1]
		if !t.Special || t.LStrip || t.RStrip || t.SingleWord || len(t.Content) < 2 ||
			strings.ContainsAny(string(last), " \t\r\n") {
			continue
		}
		b.byText[t.Content] = t
		b.first[t.Content[0]] = true
		if !seenLen[len(t.Content)] {
			seenLen[len(t.Content)] = true
			b.lengths = append(b.lengths, len(t.Content))
		}
	}
	for c := range b.first {
		if b.first[c] {
			if b.oneFirst != 0 {
				b.oneFirst = 0
				break
			}
			b.oneFirst = byte(c)
		}
	}
	// Longest first, so that a longer candidate wins at the same position.
	for i := 1; i < len(b.lengths); i++ {
		for j := i; j > 0 && b.lengths[j] > b.lengths[j-1]; j-- {
			b.lengths[j], b.lengths[j-1] = b.lengths[j-1], b.lengths[j]
		}
	}
	return b
}

// cuts lists the ends of boundary token occurrences in text that are safe
// places to cut, in order.
func (b *boundaryTokens) cuts(text string) []cut {
	if len(b.byText) == 0 {
		return nil
	}
	var out []cut
	for i := 0; i < len(text); i++ {
		if b.oneFirst != 0 {
			// All candidates start with the same byte (usually '<'): let
			// the vectorized search skip the text between them.
			j := strings.IndexByte(text[i:], b.oneFirst)
			if j < 0 {
				break
			}
			i += j
		} else if !b.first[text[i]] {
			continue
		}
		for _, l := range b.lengths {
			if i+l > len(text) {
				continue
			}
			t, ok := b.byText[text[i:i+l]]
			if !ok {
				continue
			}
			if b.isolated(text, i, i+l, t.Content) {
				out = append(out, cut{end: i + l, content: t.Content, id: t.ID})
				i += l - 1
			}
			break
		}
	}
	return out
}

// isolated reports whether no raw-matched added token other than this
// occurrence itself overlaps text[start:end] partly or contains it.
func (b *boundaryTokens) isolated(text string, start, end int, content string) bool {
	for _, other := range b.conflicts(content) {
		lo := max(0, start-len(other)+1)
		hi := min(len(text), end+len(other)-1)
		window := text[lo:hi]
		for off := 0; ; {
			j := strings.Index(window[off:], other)
			if j < 0 {
				break
			}
			s := lo + off + j
			e := s + len(other)
			if s < end && e > start && !(s == start && e == end) {
				return false
			}
			off += j + 1
		}
	}
	return true
}

// conflicts lists the raw added tokens that could overlap an occurrence of
// content without being it: one whose end overlaps content's start, whose
// start overlaps content's end, or that contains content.
func (b *boundaryTokens) conflicts(content string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if list, ok := b.conflict[content]; ok {
		return list
	}
	var list []string
	for _, t := range b.raw {
		o := t.Content
		if o == content {
			continue
		}
		if strings.Contains(o, content) || overlapsEdge(o, content) || overlapsEdge(content, o) {
			list = append(list, o)
		}
	}
	b.conflict[content] = list
	return list
}

// overlapsEdge reports whether a non-empty proper suffix of a is a prefix of
// b or of b's continuation (a straddles b's start), i.e. a ends inside b.
func overlapsEdge(a, b string) bool {
	for k := 1; k < len(a); k++ {
		suffix := a[len(a)-k:]
		if k <= len(b) {
			if strings.HasPrefix(b, suffix) {
				return true
			}
		} else if strings.HasPrefix(suffix, b) {
			return true
		}
	}
	return false
}
