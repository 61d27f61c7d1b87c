package tokenizer

import "strings"

// The byte-level alphabet of GPT-2: every byte maps to one printable rune so
// that byte strings can live in a text vocabulary. Printable Latin-1 bytes map
// to themselves; the other 68 bytes map, in order, to U+0100 onwards.
var (
	_, runeToByte, byteToStr = byteTables()
)

// byteTables builds the alphabet. It is a variable initializer rather than
// init so that other package-level variables may use the tables.
func byteTables() (toRune [256]rune, toByte [324]int16, toStr [256]string) {
	for i := range toByte {
		toByte[i] = -1
	}
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			toRune[b] = rune(b)
		} else {
			toRune[b] = next
			next++
		}
		toByte[toRune[b]] = int16(b)
		toStr[b] = string(toRune[b])
	}
	return toRune, toByte, toStr
}

// byteLevelEncode maps every byte of s to its byte-level rune.
func byteLevelEncode(s string) string {
	var sb strings.Builder
	sb.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		sb.WriteString(byteToStr[s[i]])
	}
	return sb.String()
}

// byteLevelDecode maps a byte-level string back to bytes. ok is false when a
// rune is outside the alphabet.
func byteLevelDecode(s string) (string, bool) {
	b, ok := appendByteLevelDecoded(make([]byte, 0, len(s)), s)
	return string(b), ok
}

// appendByteLevelDecoded appends the bytes s spells in the byte-level
// alphabet to dst; on a rune outside the alphabet it returns dst unchanged
// and false.
func appendByteLevelDecoded(dst []byte, s string) ([]byte, bool) {
	n := len(dst)
	for _, r := range s {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return dst[:n], false
		}
		dst = append(dst, byte(runeToByte[r]))
	}
	return dst, true
}
