package kvindex

import "unsafe"

// prefetchSlots asks the CPU to bring the cache lines of slots[at[i]] into
// cache, without waiting for them. Every at[i] must be a valid index of
// slots.
func prefetchSlots(slots []oaSlot, at []int) {
	prefetchLines(unsafe.Pointer(unsafe.SliceData(slots)), unsafe.SliceData(at), len(at))
}

// prefetchLines issues PREFETCHT0 for base+16*at[i], i < n.
//
//go:noescape
func prefetchLines(base unsafe.Pointer, at *int, n int)

// prefetchWords is prefetchSlots over a slice of words; at counts 16-byte
// units from its start.
func prefetchWords(words []uint64, at []int) {
	prefetchLines(unsafe.Pointer(unsafe.SliceData(words)), unsafe.SliceData(at), len(at))
}

// prefetchPtrs issues PREFETCHT0 for each of ptrs.
//
//go:noescape
func prefetchPtrs(ptrs []unsafe.Pointer)
