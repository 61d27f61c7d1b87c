//go:build !amd64

package kvindex

import "unsafe"

// prefetchSlots loads the first key of slots[at[i]] for every i, back to
// back, so that their cache misses at least overlap with each other; only
// amd64 has a prefetch that does not wait (prefetch_amd64.s).
//
//go:noinline
func prefetchSlots(slots []oaSlot, at []int) (sink uint64) {
	for _, i := range at {
		sink ^= slots[i].key
	}
	return sink
}

// prefetchWords loads words[2*at[i]] for every i, as prefetchSlots.
//
//go:noinline
func prefetchWords(words []uint64, at []int) (sink uint64) {
	for _, i := range at {
		sink ^= words[2*i]
	}
	return sink
}

// prefetchPtrs loads the first byte of each of ptrs, as prefetchSlots.
//
//go:noinline
func prefetchPtrs(ptrs []unsafe.Pointer) (sink uint64) {
	for _, p := range ptrs {
		sink ^= uint64(*(*byte)(p))
	}
	return sink
}
