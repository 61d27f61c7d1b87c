package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"

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
			if got, want := newUnicodeNorm(f).normalize(s), f.String(s); got != want {
				t.Fatalf("form %v of %q: got %q, want %q", f, s, got, want)
			}
		}
	}
}
