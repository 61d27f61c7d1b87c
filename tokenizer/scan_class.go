package tokenizer

import (
	"math/bits"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Character classes of the pre-tokenizer regexes. Classes of the Basic
// Multilingual Plane come from a table built once; other runes are looked up
// in the unicode package.
const (
	clL  uint16 = 1 << iota // \p{L}
	clN                     // \p{N}
	clS                     // \s (White_Space)
	clP                     // \p{P}
	clSy                    // \p{S}
	clLu                    // \p{Lu}
	clLl                    // \p{Ll}
	clLt                    // \p{Lt}
	clLm                    // \p{Lm}
	clLo                    // \p{Lo}
	clM                     // \p{M}
)

var (
	bmpClassOnce sync.Once
	bmpClass     *[0x10000]uint16
	asciiClass   [128]uint16
)

func init() {
	for r := rune(0); r < 128; r++ {
		asciiClass[r] = slowClass(r)
	}
}

func buildBMPClass() {
	t := new([0x10000]uint16)
	for r := rune(0); r < 0x10000; r++ {
		t[r] = slowClass(r)
	}
	bmpClass = t
}

func slowClass(r rune) uint16 {
	var c uint16
	switch {
	case unicode.IsLetter(r):
		c |= clL
		switch {
		case unicode.Is(unicode.Lu, r):
			c |= clLu
		case unicode.Is(unicode.Ll, r):
			c |= clLl
		case unicode.Is(unicode.Lt, r):
			c |= clLt
		case unicode.Is(unicode.Lm, r):
			c |= clLm
		default:
			c |= clLo
		}
	case unicode.IsMark(r):
		c |= clM
	case unicode.IsNumber(r):
		c |= clN
	case unicode.IsPunct(r):
		c |= clP
	case unicode.IsSymbol(r):
		c |= clSy
	}
	if unicode.IsSpace(r) {
		c |= clS
	}
	return c
}

// class returns the classes of r. The ASCII case is small enough to inline
// into the scanners.
func class(r rune) uint16 {
	if r < 128 {
		return asciiClass[r]
	}
	return nonASCIIClass(r)
}

func nonASCIIClass(r rune) uint16 {
	if r < 0x10000 {
		bmpClassOnce.Do(buildBMPClass)
		return bmpClass[r]
	}
	return slowClass(r)
}

// decode returns the rune at s[i:] and its size; i must be < len(s).
func decode(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return decodeMulti(s, i)
}

// decodeMulti is utf8.DecodeRuneInString(s[i:]) for a non-ASCII s[i]. The
// three-byte runes U+1000..U+CFFF (CJK, kana, Hangul, most scripts of South
// and East Asia) are decoded inline: after a lead byte 0xE1..0xEC any two
// continuation bytes form a valid rune (only 0xE0, 0xED and four-byte leads
// restrict them).
func decodeMulti(s string, i int) (rune, int) {
	if c := s[i]; c-0xE1 <= 0xEC-0xE1 && i+2 < len(s) {
		if b1, b2 := s[i+1], s[i+2]; b1&0xC0 == 0x80 && b2&0xC0 == 0x80 {
			return rune(c&0x0F)<<12 | rune(b1&0x3F)<<6 | rune(b2&0x3F), 3
		}
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isL(r rune) bool  { return class(r)&clL != 0 }
func isN(r rune) bool  { return class(r)&clN != 0 }
func isPS(r rune) bool { return class(r)&(clP|clSy) != 0 }
func isLM(r rune) bool { return class(r)&(clL|clM) != 0 }

// runAny returns the end of the run from s[i:] of runes having a class in
// mask, and runNone that of runes having none. ASCII bytes are classified
// from a table without decoding, which is most of the text in practice.
func runAny(s string, i int, mask uint16) int {
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			if asciiClass[c]&mask == 0 {
				return i
			}
			i++
			continue
		}
		r, n := decodeMulti(s, i)
		if nonASCIIClass(r)&mask == 0 {
			return i
		}
		i += n
	}
	return i
}

func runNone(s string, i int, mask uint16) int {
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			if asciiClass[c]&mask != 0 {
				return i
			}
			i++
			continue
		}
		r, n := decodeMulti(s, i)
		if nonASCIIClass(r)&mask != 0 {
			return i
		}
		i += n
	}
	return i
}

// runLetters is runAny(s, i, clL), the run of \p{L}, checking eight ASCII
// bytes at a time: a word of up to seven ASCII letters ends within the first
// word-sized load, without a branch per letter. Bytes below the first
// non-ASCII one see no carry from it, so the first byte flagged as not a
// letter is exact; from a non-ASCII byte on, runAny decodes runes.
func runLetters(s string, i int) int { return runLettersOr(s, i, clL) }

// runLettersOr is runAny(s, i, mask) for a mask that holds clL and no other
// class of an ASCII byte (clL|clM, say), with runLetters' eight-byte steps
// over ASCII letters.
func runLettersOr(s string, i int, mask uint16) int {
	const (
		ones = 0x0101010101010101
		high = 0x8080808080808080
	)
	for i+8 <= len(s) {
		w := load64(s[i:])
		x := w | 0x20*ones        // ASCII upper case to lower case
		ge := x + (0x80-'a')*ones // high bit: x >= 'a'
		gt := x + (0x7F-'z')*ones // high bit: x > 'z'
		if m := ge &^ gt &^ w & high; m != high {
			i += bits.TrailingZeros64(^m&high) / 8
			if s[i] < utf8.RuneSelf {
				return i
			}
			break
		}
		i += 8
	}
	return runAny(s, i, mask)
}

// runASCIILetters returns the end of the run of [A-Za-z] from s[i:],
// checking eight bytes at a time like runLetters.
func runASCIILetters(s string, i int) int {
	const (
		ones = 0x0101010101010101
		high = 0x8080808080808080
	)
	for i+8 <= len(s) {
		w := load64(s[i:])
		x := w | 0x20*ones
		ge := x + (0x80-'a')*ones
		gt := x + (0x7F-'z')*ones
		if m := ge &^ gt &^ w & high; m != high {
			return i + bits.TrailingZeros64(^m&high)/8
		}
		i += 8
	}
	for i < len(s) && isASCIILetter(rune(s[i])) {
		i++
	}
	return i
}

// runCRLF returns the end of the run of '\r' and '\n' from s[i:].
func runCRLF(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// runWhile returns the end of the run of runes satisfying f from s[i:].
func runWhile(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, n := decode(s, i)
		if !f(r) {
			break
		}
		i += n
	}
	return i
}
