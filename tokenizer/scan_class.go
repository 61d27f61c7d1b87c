package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Character classes of the pre-tokenizer regexes, with an ASCII fast path.
const (
	clL  uint8 = 1 << iota // \p{L}
	clN                    // \p{N}
	clS                    // \s (White_Space)
	clP                    // \p{P}
	clSy                   // \p{S}
	clLu                   // \p{Lu}
	clLl                   // \p{Ll}
)

var asciiClass [128]uint8

func init() {
	for r := rune(0); r < 128; r++ {
		asciiClass[r] = slowClass(r)
	}
}

func slowClass(r rune) uint8 {
	var c uint8
	switch {
	case unicode.IsLetter(r):
		c |= clL
		if unicode.Is(unicode.Lu, r) {
			c |= clLu
		} else if unicode.Is(unicode.Ll, r) {
			c |= clLl
		}
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

func class(r rune) uint8 {
	if r < 128 {
		return asciiClass[r]
	}
	return slowClass(r)
}

// decode returns the rune at s[i:] and its size; i must be < len(s).
func decode(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isL(r rune) bool     { return class(r)&clL != 0 }
func isN(r rune) bool     { return class(r)&clN != 0 }
func isSpace(r rune) bool { return class(r)&clS != 0 }
func isPS(r rune) bool    { return class(r)&(clP|clSy) != 0 }
func isLM(r rune) bool {
	if r < 128 {
		return asciiClass[r]&clL != 0
	}
	return unicode.IsLetter(r) || unicode.IsMark(r)
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
