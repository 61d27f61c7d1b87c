package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// byteModeModels returns the test families whose model runs on raw bytes.
func byteModeModels(tb testing.TB) map[string]*bpeModel {
	out := map[string]*bpeModel{}
	for _, fam := range families {
		if m := loadFamily(tb, fam).model; m.byteMode {
			out[fam] = m
		}
	}
	if len(out) == 0 {
		tb.Fatal("no byte-mode family")
	}
	return out
}

// mergeBytesReference merges the bytes of s one byte per symbol, without
// starting any character whole: what mergeBytes must equal.
func mergeBytesReference(m *bpeModel, s string) []uint32 {
	syms := make([]uint32, len(s))
	for i := 0; i < len(s); i++ {
		syms[i] = m.byteID[s[i]]
	}
	return slices.Clone(m.mergeLinear(&encodeState{}, syms))
}

// checkMergeBytes compares mergeBytes with the byte-by-byte reference on s
// and reports whether some character of s started whole, and whether some
// started as two tokens.
func checkMergeBytes(t *testing.T, fam string, m *bpeModel, s string) (whole, two bool) {
	t.Helper()
	for i := 0; i < len(s); i++ {
		if s[i] >= 0xC2 {
			if _, second, n := m.wholeChar(s, i); n > 0 {
				whole = true
				two = two || second != noRank
			}
		}
	}
	got := slices.Clone(m.mergeBytes(&encodeState{}, s))
	if want := mergeBytesReference(m, s); !slices.Equal(got, want) {
		t.Fatalf("%s: mergeBytes(%q) = %v, merging its bytes gives %v", fam, s, got, want)
	}
	return whole, two
}

// TestMergeBytesWholeChars checks that starting characters as their tokens
// gives what merging their bytes gives, on random strings of multi-byte
// characters (from the corpus and anywhere below U+10000) between ASCII,
// spaces and each other, and that it happens often.
func TestMergeBytesWholeChars(t *testing.T) {
	var corpusChars []rune
	seen := map[rune]bool{}
	for _, r := range readCorpus(t) {
		if r >= 0x80 && r < 0x10000 && !seen[r] {
			seen[r] = true
			corpusChars = append(corpusChars, r)
		}
	}
	ascii := []rune(" \t\nae.,'\"0(-_Ab")
	rnd := rand.New(rand.NewPCG(17, 3))
	randomChar := func() rune {
		switch rnd.IntN(4) {
		case 0:
			return ascii[rnd.IntN(len(ascii))]
		case 1:
			return corpusChars[rnd.IntN(len(corpusChars))]
		case 2:
			return rune(0x80 + rnd.IntN(0x800-0x80))
		default:
			for {
				if r := rune(0x800 + rnd.IntN(0x10000-0x800)); r < 0xD800 || r >= 0xE000 {
					return r
				}
			}
		}
	}
	n := 30000
	if testing.Short() {
		n = 3000
	}
	for fam, m := range byteModeModels(t) {
		if m.charTok == nil {
			t.Fatalf("%s: no whole-character table", fam)
		}
		whole, two := 0, 0
		var b strings.Builder
		for k := 0; k < n; k++ {
			b.Reset()
			for range 2 + rnd.IntN(8) {
				b.WriteRune(randomChar())
			}
			s := b.String()
			if len(s) > heapThreshold {
				continue
			}
			w, tw := checkMergeBytes(t, fam, m, s)
			if w {
				whole++
			}
			if tw {
				two++
			}
		}
		// Across invalid UTF-8 too: truncated and stray bytes around chars.
		for k := 0; k < n/10; k++ {
			b.Reset()
			for range 2 + rnd.IntN(6) {
				var buf [4]byte
				c := buf[:utf8.EncodeRune(buf[:], randomChar())]
				if rnd.IntN(4) == 0 {
					c = c[:rnd.IntN(len(c))+1]
				}
				b.Write(c)
			}
			checkMergeBytes(t, fam, m, b.String())
		}
		if whole < n/10 || two < n/100 {
			t.Fatalf("%s: a character started whole in only %d of %d strings, as two tokens in %d", fam, whole, n, two)
		}
		t.Logf("%s: a character started whole in %d of %d strings, as two tokens in %d", fam, whole, n, two)
	}
}

// FuzzMergeBytes checks mergeBytes against merging byte by byte on any
// input short enough for the linear merge.
func FuzzMergeBytes(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Add("ойчжйуы")
	f.Add(" כףםאח")
	f.Add("中文\xe4\xb8")
	models := byteModeModels(f)
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) < 2 || len(s) > heapThreshold {
			return
		}
		for fam, m := range models {
			checkMergeBytes(t, fam, m, s)
		}
	})
}
