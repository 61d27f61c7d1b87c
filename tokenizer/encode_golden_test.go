package tokenizer

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestEncodeMatchesReference checks every golden string of every family, with
// and without special tokens, id for id against Hugging Face's tokenizer.
func TestEncodeMatchesReference(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			n := checkGolden(t, loadFamily(t, fam), readGolden(t, fam))
			if n < 4000 {
				t.Fatalf("only %d golden strings, want >= 4000 (2,000 texts x 2 modes)", n)
			}
		})
	}
}

// TestEncodeCorpusMatchesReference encodes the >500 KB corpus in one call,
// id for id.
func TestEncodeCorpusMatchesReference(t *testing.T) {
	corpus := readCorpus(t)
	if len(corpus) < 500*1024 {
		t.Fatalf("corpus is %d bytes, want >= 500 KB", len(corpus))
	}
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			tok := loadFamily(t, fam)
			var want []uint32
			for _, c := range readGolden(t, fam) {
				if c.Corpus {
					want = c.IDs
				}
			}
			if want == nil {
				t.Fatal("golden file has no corpus line")
			}
			got := tok.Encode(corpus, false)
			if i := firstDiff(got, want); i >= 0 {
				lo := max(0, i-5)
				t.Fatalf("corpus differs at id %d (got %d ids, want %d):\n got %s\nwant %s", i, len(got), len(want),
					describe(tok, got[lo:min(len(got), i+5)]), describe(tok, want[lo:min(len(want), i+5)]))
			}
		})
	}
}

// checkGolden compares Encode (and Decode, where the golden line has the
// reference's decoding) with every golden case and returns how many it checked.
func checkGolden(t *testing.T, tok *Tokenizer, cases []goldenCase) int {
	t.Helper()
	n, failures := 0, 0
	for _, c := range cases {
		if c.Corpus {
			continue
		}
		n++
		got := tok.Encode(c.Text, c.AddSpecialTokens)
		if !slices.Equal(got, c.IDs) {
			failures++
			if failures <= 5 {
				t.Errorf("Encode(%q, %v):\n got %v\nwant %v\n got %s\nwant %s", c.Text, c.AddSpecialTokens,
					got, c.IDs, describe(tok, got), describe(tok, c.IDs))
			}
			continue
		}
		if c.Decoded != nil {
			if d := tok.Decode(c.IDs); d != *c.Decoded {
				failures++
				if failures <= 5 {
					t.Errorf("Decode(%v) = %q, want %q (%s)", c.IDs, d, *c.Decoded, describe(tok, c.IDs))
				}
			}
		}
	}
	if failures > 0 {
		t.Errorf("%d of %d golden cases differ", failures, n)
	}
	return n
}

func firstDiff(a, b []uint32) int {
	for i := 0; i < min(len(a), len(b)); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// describe renders ids as their token strings for failure messages.
func describe(tok *Tokenizer, ids []uint32) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		s, _ := tok.TokenString(id)
		parts[i] = fmt.Sprintf("%d:%q", id, s)
	}
	return strings.Join(parts, " ")
}
