package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// TestUnicodeNormMatchesForm checks the run-by-run normalization against
// the form applied to the whole text, on text that mixes ASCII with
// combining marks, precomposed and decomposed letters, Hangul jamo, kana
// with voicing marks and compatibility characters, which is where a
// boundary or an inert rune could matter.
func TestUnicodeNormMatchesForm(t *testing.T) {
	alphabet := []string{
		"a", "e", "A", " ", "\n", "1", "-", "\u0301", "\u0300", "\u0327", "\u0323", "\u0302",
		"é", "ñ", "Å", "\u212B", "\u1100", "\u1161", "\u11A8", "가", "ﬁ", "①", "\u0958",
		"\u0915", "\u093C", "\u0CC6", "\u0CD5", "\u0DD9", "\u0DCA", "日本", "\uFF21", "\u00A0",
		"\U0001D400", "\u0344", "\u1E9B", "я", "\u0308", "ω", "ά", "\u0345", "中文", "\u3099", "か",
		"\u0627", "\u0653", "\u0E01", "\u0E33",
	}
	rng := rand.New(rand.NewPCG(17, 1))
	forms := []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD}
	st := &encodeState{}
	for k := 0; k < 20000; k++ {
		var b strings.Builder
		for n := rng.IntN(24); n > 0; n-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
			if rng.IntN(4) == 0 {
				b.WriteString("plain ascii ")
			}
		}
		s := b.String()
		for _, f := range forms {
			want := f.String(s)
			if got := newUnicodeNorm(f).normalize(s); got != want {
				t.Fatalf("form %v of %q: got %q, want %q", f, s, got, want)
			}
			if got := newUnicodeNorm(f).normalizeScratch(st, s); got != want {
				t.Fatalf("form %v of %q into scratch: got %q, want %q", f, s, got, want)
			}
		}
	}
	// More than 30 combining marks in a row: the form inserts U+034F.
	long := "a" + strings.Repeat("\u0301\u0323", 40) + " b"
	for _, f := range forms {
		if got, want := newUnicodeNorm(f).normalizeScratch(st, long), f.String(long); got != want {
			t.Fatalf("form %v of 80 marks: got %q, want %q", f, got, want)
		}
	}
}

// FuzzNormalize checks both ways of normalizing (a new string, or into a
// reused scratch buffer) against the form applied to the whole text. Only
// valid UTF-8 is normalized: Encode replaces invalid bytes first.
func FuzzNormalize(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Add("a" + strings.Repeat("\u0301", 35))
	forms := []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD}
	st := &encodeState{}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for _, form := range forms {
			want := form.String(s)
			n := newUnicodeNorm(form)
			if got := n.normalize(s); got != want {
				t.Fatalf("form %v of %q: got %q, want %q", form, s, got, want)
			}
			if got := n.normalizeScratch(st, s); got != want {
				t.Fatalf("form %v of %q into scratch: got %q, want %q", form, s, got, want)
			}
		}
	})
}
