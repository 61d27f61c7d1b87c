package kvindex

import "math/bits"

// hashBlock16 is HashBlocks' step for a block of 16 tokens:
// xxh3.Hash(LE64(prev) ‖ LE32 t[0] … LE32 t[15]), computed from prev and
// the tokens where they lie instead of from a copy of them. The input is
// 72 bytes, which XXH3-64 hashes by its 65-to-96-byte rule: six 128-bit
// products of input words with words of its default secret, folded and
// summed, then avalanched. TestHashBlock16MatchesXXH3 holds it to the
// library's answer.
func hashBlock16(prev uint64, t *[16]uint32) uint64 {
	// w(i) is the input's little-endian word at byte 8+8i.
	w := func(i int) uint64 { return uint64(t[2*i]) | uint64(t[2*i+1])<<32 }
	acc := xxhLen72
	acc += fold(w(3)^xxhSecret[8], w(4)^xxhSecret[9]) + fold(w(2)^xxhSecret[10], w(3)^xxhSecret[11])
	acc += fold(w(1)^xxhSecret[4], w(2)^xxhSecret[5]) + fold(w(4)^xxhSecret[6], w(5)^xxhSecret[7])
	acc += fold(prev^xxhSecret[0], w(0)^xxhSecret[1]) + fold(w(6)^xxhSecret[2], w(7)^xxhSecret[3])
	acc ^= acc >> 37
	acc *= 0x165667919e3779f9
	return acc ^ acc>>32
}

func fold(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

// xxhPrime64 is XXH3's PRIME64_1.
const xxhPrime64 = 0x9e3779b185ebca87

// xxhLen72 is 72 × PRIME64_1 in 64-bit arithmetic, where XXH3 starts a
// 72-byte input.
const xxhLen72 = uint64(72 * xxhPrime64 % (1 << 64))

// xxhSecret is the first 96 bytes of XXH3's default secret (kSecret), as
// little-endian words: those a 72-byte input reads.
var xxhSecret = [12]uint64{
	0xbe4ba423396cfeb8, 0x1cad21f72c81017c, 0xdb979083e96dd4de, 0x1f67b3b7a4a44072,
	0x78e5c0cc4ee679cb, 0x2172ffcc7dd05a82, 0x8e2443f7744608b8, 0x4c263a81e69035e0,
	0xcb00c391bb52283c, 0xa32e531b8b65d088, 0x4ef90da297486471, 0xd8acdea946ef1938,
}
