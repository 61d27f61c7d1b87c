package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// isolatingChain builds a chain of isolating splits on the given patterns,
// as Load would (withoutIdentity sets the chain's isolators).
func isolatingChain(tb testing.TB, patterns ...string) *preChain {
	tb.Helper()
	var steps []preStep
	for _, p := range patterns {
		m, err := compileRegex(p)
		if err != nil {
			tb.Fatal(err)
		}
		if m.scan == nil {
			tb.Fatalf("pattern %q has no scanner", p)
		}
		steps = append(steps, &splitStep{m: m, behavior: isolated})
	}
	c := (&preChain{steps: steps}).withoutIdentity()
	if len(c.isolators) != len(patterns) {
		tb.Fatalf("chain of %d isolating splits has %d isolators", len(patterns), len(c.isolators))
	}
	return c
}

// streamedChains are the chains the equivalence tests stream: DeepSeek-V3's
// as loaded, and the known scanners in other orders, so that each skip sees
// pieces cut by every other pattern.
func streamedChains(tb testing.TB) map[string]*preChain {
	tb.Helper()
	ds := loadFamily(tb, "deepseek_v3").pre
	if ds == nil || len(ds.isolators) != 3 {
		tb.Fatalf("deepseek_v3's chain does not stream: %+v", ds)
	}
	return map[string]*preChain{
		"deepseek_v3":         ds,
		"kana,digits":         isolatingChain(tb, patDeepSeekK, patDigits3),
		"digits,kana,cl100k":  isolatingChain(tb, patDigits3, patDeepSeekK, patCL100K),
		"gpt2,kana,qwen2":     isolatingChain(tb, patGPT2, patDeepSeekK, patQwen2),
		"o200k,digits,digits": isolatingChain(tb, patO200K, patDigits3, patDigits3),
		"deepseek3,kana":      isolatingChain(tb, patDeepSeek3, patDeepSeekK),
	}
}

// streamedPieces returns the pieces isolateChainEach cuts s into, with the
// first flag preChain.run would give them.
func streamedPieces(c *preChain, s string, first bool) []piece {
	var out []piece
	isolateChainEach(s, c.isolators, func(a, b int) {
		out = append(out, piece{text: s[a:b], first: first && a == 0})
	})
	return out
}

// listedPieces returns a copy of preChain.run's pieces.
func listedPieces(c *preChain, s string, first bool) []piece {
	st := &encodeState{}
	return slices.Clone(c.run(st, piece{text: s, first: first}))
}

func checkChain(t *testing.T, name string, c *preChain, s string) {
	t.Helper()
	for _, first := range []bool{true, false} {
		got, want := streamedPieces(c, s, first), listedPieces(c, s, first)
		if !slices.Equal(got, want) {
			t.Fatalf("chain %s on %q (first %v):\n streamed %+v\n run      %+v", name, s, first, got, want)
		}
	}
}

// randomChainString mixes runs of ASCII words and digits (long enough for
// the eight-byte steps of skipToN and skipToKana) with the scanner alphabet,
// and, when invalid is set, stray bytes that are not UTF-8.
func randomChainString(r *rand.Rand, invalid bool) string {
	words := []string{"hello world ", "The 2024 ", "x=12345;", "don't ", "  \n", "ABCDEFGHIJ", "日本語の", "テキスト", "中文123"}
	var b strings.Builder
	for n := r.IntN(40); n > 0; n-- {
		switch k := r.IntN(10); {
		case k < 3:
			b.WriteString(words[r.IntN(len(words))])
		case k == 3 && invalid:
			b.WriteByte(byte(0x80 + r.IntN(0x80)))
		default:
			b.WriteRune(scanAlphabet[r.IntN(len(scanAlphabet))])
		}
	}
	return b.String()
}

// TestIsolateChainMatchesRun checks that streaming a chain of isolating
// splits gives exactly the pieces, in order and with their first flags,
// that preChain.run lists step by step, on the corpus (whole and line by
// line) and on random strings, valid UTF-8 or not.
func TestIsolateChainMatchesRun(t *testing.T) {
	corpus := readCorpus(t)
	iterations := 5000
	if raceEnabled || testing.Short() {
		iterations = 500
	}
	for name, c := range streamedChains(t) {
		checkChain(t, name, c, corpus)
		for _, line := range strings.SplitAfter(corpus, "\n") {
			checkChain(t, name, c, line)
		}
		r := rand.New(rand.NewPCG(7, uint64(len(name))))
		for k := range iterations {
			checkChain(t, name, c, randomChainString(r, k%4 == 0))
		}
	}
}

// TestChainIsolatorsOnlyForIsolatingSplits checks that a chain streams only
// when every step is an isolating split with a scanner.
func TestChainIsolatorsOnlyForIsolatingSplits(t *testing.T) {
	digits, err := compileRegex(patDigits3)
	if err != nil {
		t.Fatal(err)
	}
	other, err := compileRegex(`[a-c]+`) // regexp2, no scanner
	if err != nil {
		t.Fatal(err)
	}
	iso := &splitStep{m: digits, behavior: isolated}
	for name, steps := range map[string][]preStep{
		"removed":   {iso, &splitStep{m: digits, behavior: removed}},
		"inverted":  {iso, &splitStep{m: digits, behavior: isolated, invert: true}},
		"regexp2":   {iso, &splitStep{m: other, behavior: isolated}},
		"bytelevel": {iso, &byteLevelStep{useRegex: true}},
		"charsplit": {iso, &charSplitStep{pred: isN, behavior: isolated}},
	} {
		if got := chainIsolators(steps); got != nil {
			t.Errorf("%s: chain has isolators %v", name, got)
		}
	}
	if got := chainIsolators([]preStep{iso, iso}); len(got) != 2 || got[0].skip == nil {
		t.Errorf("two digit splits: isolators %v, want two with a skip", got)
	}
}

// TestSkipsPassOnlyNonMatches checks every skip against its scanner: from
// each position rune-by-rune stepping reaches, the skip lands on another
// such position, and the scanner matches at none of those it passes over.
func TestSkipsPassOnlyNonMatches(t *testing.T) {
	iterations := 3000
	if raceEnabled || testing.Short() {
		iterations = 300
	}
	r := rand.New(rand.NewPCG(11, 12))
	for k := range iterations {
		checkSkips(t, randomChainString(r, k%3 == 0))
	}
}

func checkSkips(t *testing.T, s string) {
	t.Helper()
	var stops []int // the positions rune-by-rune stepping reaches
	for i := 0; i < len(s); {
		stops = append(stops, i)
		_, n := utf8.DecodeRuneInString(s[i:])
		i += n
	}
	stops = append(stops, len(s))
	for src, skip := range knownSkips {
		scan := knownScanners[src]
		for k, i := range stops[:len(stops)-1] {
			j := skip(s, i)
			at, ok := slices.BinarySearch(stops, j)
			if !ok || at < k {
				t.Fatalf("pattern %q on %q: skip from %d lands on %d, not a later rune start", src, s, i, j)
			}
			for _, p := range stops[k:at] {
				if e := scan(s, p); e > p {
					t.Fatalf("pattern %q on %q: skip from %d to %d passes over the match %q at %d", src, s, i, j, s[p:e], p)
				}
			}
		}
	}
}

// FuzzIsolateChain compares the streamed chains with preChain.run, and the
// skips with their scanners, on arbitrary bytes.
func FuzzIsolateChain(f *testing.F) {
	for _, s := range []string{"", "Hello world's 12345", "日本語テキスト123", "abc\xe3\x81def", "  \n\t x", "\xe4\xb8", "x1234567890y中"} {
		f.Add(s)
	}
	chains := streamedChains(f)
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			return
		}
		for name, c := range chains {
			checkChain(t, name, c, s)
		}
		if len(s) <= 256 { // checkSkips is quadratic
			checkSkips(t, s)
		}
	})
}
