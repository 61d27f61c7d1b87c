package tokenizer

import "unicode/utf8"

// Hand-written scanners for the Split regexes of widely used models. Each
// returns the end of the match at s[i:] (or -1), reproducing the regex's
// leftmost-first alternation and backtracking. scan_test.go checks every one
// against regexp2 on random strings.

const (
	// Llama 3 and OpenAI cl100k_base.
	patCL100K = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Qwen2, Qwen2.5 and Qwen3: cl100k with single digits.
	patQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// OpenAI o200k_base.
	patO200K = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek-V3's chain of three.
	patDigits3   = `\p{N}{1,3}`
	patDeepSeekK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	patDeepSeek3 = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	// GPT-2's pattern, used by the ByteLevel pre-tokenizer with use_regex.
	patGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

var knownScanners = map[string]scanFunc{
	patCL100K:    func(s string, i int) int { return scanCL100K(s, i, 3) },
	patQwen2:     func(s string, i int) int { return scanCL100K(s, i, 1) },
	patO200K:     scanO200K,
	patDigits3:   scanDigits3,
	patDeepSeekK: scanKana,
	patDeepSeek3: scanDeepSeek3,
	patGPT2:      scanGPT2,
}

// knownSkips holds, for the patterns whose matches start only at a few
// runes, the skip to the next such rune. In DeepSeek-V3's chain the digit
// and CJK/kana splits match rarely, so most of their time went into trying
// the scanner at every rune in between.
var knownSkips = map[string]skipFunc{
	patDigits3:   skipToN,
	patDeepSeekK: skipToKana,
}

const (
	ones64 = 0x0101010101010101
	high64 = 0x8080808080808080
)

// skipToN returns the first position from i of a \p{N} rune, or len(s).
// Eight ASCII bytes without a digit are passed over at a time.
func skipToN(s string, i int) int {
	for i < len(s) {
		if i+8 <= len(s) {
			w := load64(s[i:])
			// High bit of ge&^gt: the ASCII byte is in '0'..'9'.
			ge, gt := w+(0x80-'0')*ones64, w+(0x7F-'9')*ones64
			if (w|ge&^gt)&high64 == 0 {
				i += 8
				continue
			}
		}
		if c := s[i]; c < utf8.RuneSelf {
			if c-'0' < 10 {
				return i
			}
			i++
			continue
		}
		if c := s[i]; c-0xE4 <= 0xE9-0xE4 && i+2 < len(s) && s[i+1]&0xC0 == 0x80 && s[i+2]&0xC0 == 0x80 {
			i += 3 // U+4000..U+9FFF, CJK ideographs and hexagrams, holds no \p{N}
			continue
		}
		r, n := decodeMulti(s, i)
		if nonASCIIClass(r)&clN != 0 {
			return i
		}
		i += n
	}
	return i
}

// skipToKana returns the first position from i of a byte 0xE3..0xE9, or
// len(s). Every rune of [\x{4e00}-\x{9fa5}\x{3040}-\x{30ff}] is three
// bytes led by one of those, and such a byte is never a continuation byte,
// so rune-by-rune stepping reaches it even in invalid UTF-8.
func skipToKana(s string, i int) int {
	for i < len(s) {
		if i+8 <= len(s) && load64(s[i:])&high64 == 0 {
			i += 8
			continue
		}
		if s[i]-0xE3 <= 0xE9-0xE3 {
			return i
		}
		i++
	}
	return i
}

// contraction matches (?i:s|t|re|ve|m|ll|d) at s[i:] (after the apostrophe).
func contraction(s string, i int, fold bool) int {
	if i >= len(s) {
		return -1
	}
	c := s[i]
	if fold && c >= 'A' && c <= 'Z' {
		c += 'a' - 'A'
	}
	next := func(j int, want byte) bool {
		if j >= len(s) {
			return false
		}
		d := s[j]
		if fold && d >= 'A' && d <= 'Z' {
			d += 'a' - 'A'
		}
		return d == want
	}
	switch c {
	case 's', 't', 'm', 'd':
		return i + 1
	case 'r', 'v':
		if next(i+1, 'e') {
			return i + 2
		}
	case 'l':
		if next(i+1, 'l') {
			return i + 2
		}
	case 0xC5: // U+017F LATIN SMALL LETTER LONG S folds to s
		if fold && i+1 < len(s) && s[i+1] == 0xBF {
			return i + 2
		}
	}
	return -1
}

// whitespaceTail matches \s*[\r\n]+|\s+(?!\S)|\s+ at s[i:], where s[i] is
// whitespace.
func whitespaceTail(s string, i int) int { return wsTail(s, i, true) }

// wsTail is whitespaceTail, without the \s*[\r\n]+ branch unless newlines.
func wsTail(s string, i int, newlines bool) int {
	end, lastNL, lastStart := i, -1, i
	for end < len(s) {
		if c := s[end]; c < utf8.RuneSelf {
			if asciiClass[c]&clS == 0 {
				break
			}
			if c == '\r' || c == '\n' {
				lastNL = end + 1
			}
			lastStart = end
			end++
			continue
		}
		r, n := decodeMulti(s, end)
		if nonASCIIClass(r)&clS == 0 {
			break
		}
		lastStart = end
		end += n
	}
	if end == i {
		return -1
	}
	if newlines && lastNL > 0 {
		return lastNL
	}
	if end == len(s) || lastStart == i {
		return end
	}
	return lastStart
}

func scanCL100K(s string, i, maxDigits int) int {
	// The common ASCII starts, in the pattern's order: a letter run, a
	// letter run after one ASCII character that is none of letter, digit,
	// CR, LF or apostrophe (" word", "(word"), and digits.
	if c := s[i]; c < utf8.RuneSelf && c != '\'' {
		cl := asciiClass[c]
		if cl&clL != 0 {
			return runLetters(s, i+1)
		}
		if cl&clN == 0 && c != '\r' && c != '\n' && i+1 < len(s) {
			if c2 := s[i+1]; c2 < utf8.RuneSelf && asciiClass[c2]&clL != 0 {
				return runLetters(s, i+2)
			}
		}
		if cl&clN != 0 && maxDigits == 1 {
			return i + 1
		}
	}
	r, n := decode(s, i)
	if r == '\'' {
		if e := contraction(s, i+1, true); e > 0 {
			return e
		}
	}
	cl := class(r)
	if cl&clL != 0 {
		return runLetters(s, i+n)
	}
	if r != '\r' && r != '\n' && cl&clN == 0 && i+n < len(s) {
		if r2, n2 := decode(s, i+n); class(r2)&clL != 0 {
			return runLetters(s, i+n+n2)
		}
	}
	if cl&clN != 0 {
		j := i + n
		for k := 1; k < maxDigits && j < len(s); k++ {
			r2, n2 := decode(s, j)
			if class(r2)&clN == 0 {
				break
			}
			j += n2
		}
		return j
	}
	if e := otherRun(s, i, r, n, cl); e > 0 {
		return e
	}
	return whitespaceTail(s, i)
}

func isOther(r rune) bool { return class(r)&(clS|clL|clN) == 0 }

// otherRun matches ` ?[^\s\p{L}\p{N}]+[\r\n]*` at s[i:].
func otherRun(s string, i int, r rune, n int, cl uint16) int {
	j := -1
	if r == ' ' && i+1 < len(s) {
		if r2, _ := decode(s, i+1); isOther(r2) {
			j = i + 1
		}
	}
	if j < 0 && cl&(clS|clL|clN) == 0 {
		j = i
	}
	if j < 0 {
		return -1
	}
	return runCRLF(s, runNone(s, j, clS|clL|clN))
}

func scanGPT2(s string, i int) int {
	r, n := decode(s, i)
	if r == '\'' {
		if e := contraction(s, i+1, false); e > 0 {
			return e
		}
	}
	j := i
	if r == ' ' && i+1 < len(s) {
		j = i + 1
		r, n = decode(s, j)
	}
	cl := class(r)
	switch {
	case cl&clL != 0:
		return runWhile(s, j+n, isL)
	case cl&clN != 0:
		return runWhile(s, j+n, isN)
	case cl&clS == 0:
		return runWhile(s, j+n, isOther)
	}
	// j > i here only if s[i] is a space followed by whitespace.
	return wsTail(s, i, false)
}

func scanDigits3(s string, i int) int {
	j := i
	for k := 0; k < 3 && j < len(s); k++ {
		r, n := decode(s, j)
		if !isN(r) {
			break
		}
		j += n
	}
	if j == i {
		return -1
	}
	return j
}

func isKana(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}

func scanKana(s string, i int) int {
	j := i
	for j < len(s) {
		r, n := decode(s, j)
		if !isKana(r) {
			break
		}
		j += n
	}
	if j == i {
		return -1
	}
	return j
}

func isASCIILetter(r rune) bool { return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') }

func scanDeepSeek3(s string, i int) int {
	// The ASCII starts, in the pattern's order: after a letter the first
	// branch cannot match and the second takes no optional rune; a letter
	// after one ASCII rune starts the first branch,
	// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+, when that rune is
	// punctuation or a symbol (only ASCII ones are in its set), else the
	// second with the optional rune unless that is CR or LF.
	if c := s[i]; c < utf8.RuneSelf {
		cl := asciiClass[c]
		if cl&clL != 0 {
			return runLettersOr(s, i+1, clL|clM)
		}
		if i+1 < len(s) && isASCIILetter(rune(s[i+1])) {
			if cl&(clP|clSy) != 0 {
				return runASCIILetters(s, i+2)
			}
			if c != '\r' && c != '\n' {
				return runLettersOr(s, i+2, clL|clM)
			}
		}
	}
	r, n := decode(s, i)
	cl := class(r)
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if r != '\r' && r != '\n' && cl&(clL|clP|clSy) == 0 && i+n < len(s) {
		if r2, n2 := decode(s, i+n); isLM(r2) {
			return runLettersOr(s, i+n+n2, clL|clM)
		}
	}
	if cl&(clL|clM) != 0 {
		return runLettersOr(s, i+n, clL|clM)
	}
	// ` ?[\p{P}\p{S}]+[\r\n]*`
	j := -1
	if r == ' ' && i+1 < len(s) {
		if r2, _ := decode(s, i+1); isPS(r2) {
			j = i + 1
		}
	}
	if j < 0 && cl&(clP|clSy) != 0 {
		j = i
	}
	if j >= 0 {
		return runCRLF(s, runAny(s, j, clP|clSy))
	}
	if cl&clS != 0 {
		return whitespaceTail(s, i)
	}
	return -1
}
