package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
)

// defaultCacheSlots bounds the piece cache: at most this many pieces (each
// shorter than maxCachedPiece bytes) are remembered per tokenizer. Small
// vocabularies get fewer slots (one per token, at least 1024).
const defaultCacheSlots = 1 << 16

// pieceCache is a bounded, direct-mapped cache from a pre-tokenized piece to
// its ids. Each slot holds an immutable entry behind an atomic pointer, so
// readers never lock; a colliding piece simply replaces the slot's entry.
type pieceCache struct {
	seed  maphash.Seed
	mask  uint64
	slots []atomic.Pointer[cacheEntry]
}

type cacheEntry struct {
	key string
	ids []uint32
}

func newPieceCache(slots int) *pieceCache {
	n := 1
	for n < slots {
		n <<= 1
	}
	return &pieceCache{seed: maphash.MakeSeed(), mask: uint64(n - 1), slots: make([]atomic.Pointer[cacheEntry], n)}
}

func (c *pieceCache) get(s string) ([]uint32, bool) {
	e := c.slots[maphash.String(c.seed, s)&c.mask].Load()
	if e == nil || e.key != s {
		return nil, false
	}
	return e.ids, true
}

func (c *pieceCache) put(s string, ids []uint32) {
	// Clone the key: s usually points into the caller's whole text.
	e := &cacheEntry{key: strings.Clone(s), ids: append([]uint32(nil), ids...)}
	c.slots[maphash.String(c.seed, s)&c.mask].Store(e)
}
