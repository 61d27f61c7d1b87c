package tokenizer

import (
	"hash/maphash"
	"sync/atomic"
	"unsafe"
)

// DefaultPieceCacheSlots is the piece cache's size unless WithPieceCache
// sets another: about as many pieces as Hugging Face's BPE word cache holds
// (10,000), rounded up to a power of two. Only pieces that needed merges go
// in, each shorter than maxCachedPiece bytes, so the cache holds at most
// 16 Ki × (256 B + ids) and in practice a few hundred KB.
const DefaultPieceCacheSlots = 1 << 14

// pieceCache is a bounded, direct-mapped cache from a pre-tokenized piece to
// its ids. Each slot holds an immutable entry behind an atomic pointer, so
// concurrent encodes share it without a lock; a colliding piece simply
// replaces the slot's entry.
type pieceCache struct {
	seed  maphash.Seed
	mask  uint64
	slots []atomic.Pointer[cacheEntry]
}

// cacheEntry is one cached piece. key and ids share one allocation: ids
// first, then the key's bytes.
type cacheEntry struct {
	key string
	ids []uint32
}

// newPieceCache returns a cache of slots rounded up to a power of two, or
// nil (no cache) when slots <= 0.
func newPieceCache(slots int) *pieceCache {
	if slots <= 0 {
		return nil
	}
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
	// Copy the key: s usually points into the caller's whole text. One
	// pointer-free buffer holds the ids and then the key's bytes.
	buf := make([]uint32, len(ids)+(len(s)+3)/4)
	copy(buf, ids)
	kb := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf[len(ids):]))), len(s))
	copy(kb, s)
	e := &cacheEntry{key: unsafe.String(unsafe.SliceData(kb), len(s)), ids: buf[:len(ids):len(ids)]}
	c.slots[maphash.String(c.seed, s)&c.mask].Store(e)
}

// reset empties the cache. Concurrent encodes stay correct; they only miss.
func (c *pieceCache) reset() {
	for i := range c.slots {
		c.slots[i].Store(nil)
	}
}
