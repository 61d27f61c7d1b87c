package kvindex

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// seedDomain separates kvroute's seeds from any other use of xxh3.
const seedDomain = "kvroute/block-hash/v1"

// maxStackBlock is the largest block (in tokens) hashed from a stack buffer;
// larger blocks stream through an xxh3.Hasher.
const maxStackBlock = 128

// Seed returns h0, the root of every block-hash chain for one model, LoRA
// adapter and cache salt (docs/architecture.md §3.5). Empty loraName means the base model;
// empty cacheSalt means no salt. Each part is length-prefixed so that no two
// different triples share an encoding.
func Seed(model, loraName, cacheSalt string) uint64 {
	var stack [256]byte
	buf := append(stack[:0], seedDomain...)
	for _, s := range [...]string{model, loraName, cacheSalt} {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(s)))
		buf = append(buf, s...)
	}
	return nonZero(xxh3.Hash(buf))
}

// HashBlocks appends to dst the chained hash of every full block of tokens:
// h_i = xxh3_64(LE64(h_{i-1}) ‖ LE32 tokens of block i), with h_{-1} = seed.
// A trailing partial block is not hashed. blockSize < 1 hashes nothing.
// Requests and KV events both go through this function, so equal token
// prefixes under equal seeds always give equal hashes.
//
// A hash that would be 0 is replaced by 1: 0 marks an empty slot inside the
// index, and the chance of this ever happening is 2^-64 per block.
func HashBlocks(seed uint64, tokens []uint32, blockSize int, dst []uint64) []uint64 {
	if blockSize < 1 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	prev := seed
	if blockSize > maxStackBlock {
		h := xxh3.New()
		var tmp [8]byte
		for i := 0; i < n; i++ {
			h.Reset()
			binary.LittleEndian.PutUint64(tmp[:], prev)
			_, _ = h.Write(tmp[:])
			for _, t := range tokens[i*blockSize : (i+1)*blockSize] {
				binary.LittleEndian.PutUint32(tmp[:4], t)
				_, _ = h.Write(tmp[:4])
			}
			prev = nonZero(h.Sum64())
			dst = append(dst, prev)
		}
		return dst
	}
	if blockSize == 16 {
		for i := 0; i < n; i++ {
			prev = nonZero(hashBlock16(prev, (*[16]uint32)(tokens[i*16:])))
			dst = append(dst, prev)
		}
		return dst
	}
	var buf [8 + 4*maxStackBlock]byte
	b := buf[:8+4*blockSize]
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint64(b, prev)
		blk := tokens[i*blockSize : (i+1)*blockSize]
		if littleEndian {
			// The tokens' memory is already LE32 each.
			copy(b[8:], unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(blk))), 4*len(blk)))
		} else {
			for j, t := range blk {
				binary.LittleEndian.PutUint32(b[8+4*j:], t)
			}
		}
		prev = nonZero(xxh3.Hash(b))
		dst = append(dst, prev)
	}
	return dst
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// littleEndian: this machine stores a uint32 as LE32.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1
