package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// scanAlphabet mixes the characters the patterns treat differently: ASCII
// and non-ASCII letters of every case class, marks, numbers, punctuation,
// symbols, every kind of whitespace, apostrophes with contraction letters,
// controls, ZWJ, emoji and the edges of DeepSeek's CJK/kana ranges.
var scanAlphabet = []rune(
	"aAsStTrReEvVmMlLdDxyzQ" + "'''" + "éÉßİǅʰ中日ا" + "\u0301\u0e31\u093e" +
		"0123٣½Ⅻ" + ".,!?-()[]{}\"#$%&*+/:;<=>@\\^_`|~" + "€∑😀👍🏽" +
		"   \t\n\r\u00a0\u3000\u2003\u000b\u000c\u0085\u2028" + "\u0000\u200d\u00ad" +
		"\u4e00\u9fa5\u9fa6\u3040\u309f\u30a0\u30ff\u3041\u30a2ー")

func randomScanString(r *rand.Rand) string {
	n := r.IntN(24)
	var b strings.Builder
	for range n {
		b.WriteRune(scanAlphabet[r.IntN(len(scanAlphabet))])
	}
	return b.String()
}

// TestScannersMatchRegexp2 cross-checks every hand-written scanner against
// regexp2 running the original pattern, on random strings.
func TestScannersMatchRegexp2(t *testing.T) {
	iterations := 20000
	if raceEnabled || testing.Short() {
		iterations = 3000
	}
	for src, scan := range knownScanners {
		re := regexp2.MustCompile(src, regexp2.None)
		want := &matcher{source: src, re: re}
		got := &matcher{source: src, scan: scan}
		r := rand.New(rand.NewPCG(1, uint64(len(src))))
		for range iterations {
			s := randomScanString(r)
			g, w := got.findAll(s, nil), want.findAll(s, nil)
			if !slices.Equal(g, w) {
				t.Fatalf("pattern %q on %q:\n scanner %v %q\n regexp2 %v %q", src, s, g, pieces(s, g), w, pieces(s, w))
			}
		}
	}
}

func pieces(s string, locs []int) []string {
	var out []string
	for k := 0; k < len(locs); k += 2 {
		out = append(out, s[locs[k]:locs[k+1]])
	}
	return out
}

// FuzzScanners compares every hand-written scanner with regexp2 on
// arbitrary valid UTF-8.
func FuzzScanners(f *testing.F) {
	for _, s := range []string{"", "Hello world's", "  \n\t x", "123456", "日本語テキスト", "a\u0301b", "'LL 'S"} {
		f.Add(s)
	}
	type pair struct{ got, want *matcher }
	var ms []pair
	for src, scan := range knownScanners {
		ms = append(ms, pair{&matcher{source: src, scan: scan}, &matcher{source: src, re: regexp2.MustCompile(src, regexp2.None)}})
	}
	f.Fuzz(func(t *testing.T, s string) {
		// regexp2 backtracks, so long inputs only slow the oracle down.
		if !utf8.ValidString(s) || len(s) > 512 {
			return
		}
		for _, m := range ms {
			if g, w := m.got.findAll(s, nil), m.want.findAll(s, nil); !slices.Equal(g, w) {
				t.Fatalf("pattern %q on %q:\n scanner %q\n regexp2 %q", m.got.source, s, pieces(s, g), pieces(s, w))
			}
		}
	})
}

// TestRunLettersMatchesRunAny compares the eight-bytes-at-a-time letter run
// with the byte-by-byte one from every start, on text mixing ASCII letters,
// every other ASCII byte, non-ASCII letters and marks, and invalid bytes.
func TestRunLettersMatchesRunAny(t *testing.T) {
	alphabet := []string{"a", "z", "A", "Z", "m", "@", "[", "`", "{", "~", "\x7f", "\x00", " ", "0", "é", "日", "\u0301", "Я", "\xff", "\xc3", "ß"}
	rng := rand.New(rand.NewPCG(3, 4))
	for k := 0; k < 5000; k++ {
		var b strings.Builder
		for n := rng.IntN(30); n > 0; n-- {
			if rng.IntN(3) == 0 {
				b.WriteString("abcdefghijKLMNOPQRS"[:rng.IntN(19)])
			}
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s := b.String()
		for i := 0; i < len(s); i++ {
			if got, want := runLetters(s, i), runAny(s, i, clL); got != want {
				t.Fatalf("runLetters(%q, %d) = %d, runAny = %d", s, i, got, want)
			}
			checkLetterRuns(t, s, i)
		}
	}
	for c := 0; c < 256; c++ {
		s := "abcdefg" + string([]byte{byte(c)}) + "abcdefgh"
		if got, want := runLetters(s, 0), runAny(s, 0, clL); got != want {
			t.Fatalf("byte %#x: runLetters = %d, runAny = %d", c, got, want)
		}
		checkLetterRuns(t, s, 0)
	}
}

// checkLetterRuns compares runLettersOr with clL|clM (DeepSeek-V3's letter
// and mark runs) with runAny, and runASCIILetters with a byte loop.
func checkLetterRuns(t *testing.T, s string, i int) {
	t.Helper()
	if got, want := runLettersOr(s, i, clL|clM), runAny(s, i, clL|clM); got != want {
		t.Fatalf("runLettersOr(%q, %d, L|M) = %d, runAny = %d", s, i, got, want)
	}
	want := i
	for want < len(s) && isASCIILetter(rune(s[want])) {
		want++
	}
	if got := runASCIILetters(s, i); got != want {
		t.Fatalf("runASCIILetters(%q, %d) = %d, want %d", s, i, got, want)
	}
}

// FuzzRunLetters compares runLetters with runAny on arbitrary bytes.
func FuzzRunLetters(f *testing.F) {
	f.Add("abcdefghij klm", 0)
	f.Add("abcdefg\xc3\xa9xyz", 2)
	f.Fuzz(func(t *testing.T, s string, i int) {
		if i < 0 || i >= len(s) {
			return
		}
		if got, want := runLetters(s, i), runAny(s, i, clL); got != want {
			t.Fatalf("runLetters(%q, %d) = %d, runAny = %d", s, i, got, want)
		}
		checkLetterRuns(t, s, i)
	})
}

// TestDecodeMultiMatchesUTF8 compares decodeMulti with the standard
// library on every non-ASCII first byte followed by nothing, by any byte
// and by any byte and an ASCII one, and every three-byte string led by
// 0xE0..0xEF (the leads of three-byte runes).
func TestDecodeMultiMatchesUTF8(t *testing.T) {
	for c := 0x80; c < 0x100; c++ {
		for b1 := 0; b1 < 0x100; b1++ {
			for _, s := range []string{string([]byte{byte(c)}), string([]byte{byte(c), byte(b1)}), string([]byte{byte(c), byte(b1), 'x'})} {
				checkDecodeMulti(t, s)
			}
			for b2 := 0; b2 < 0x100 && c&0xF0 == 0xE0; b2++ {
				checkDecodeMulti(t, string([]byte{byte(c), byte(b1), byte(b2)}))
			}
		}
	}
}

func checkDecodeMulti(t *testing.T, s string) {
	t.Helper()
	r, n := decodeMulti(s, 0)
	if wr, wn := utf8.DecodeRuneInString(s); r != wr || n != wn {
		t.Fatalf("decodeMulti(%q) = %U, %d; utf8 = %U, %d", s, r, n, wr, wn)
	}
}

// TestNoNumbersInCJKBlock pins the fact skipToN relies on to pass three-byte
// runes led by 0xE4..0xE9 without decoding them.
func TestNoNumbersInCJKBlock(t *testing.T) {
	for r := rune(0x4000); r <= 0x9FFF; r++ {
		if nonASCIIClass(r)&clN != 0 {
			t.Fatalf("%U is \\p{N}", r)
		}
	}
}
