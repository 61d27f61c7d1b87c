package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadRejectsUnsupported checks that a file using a component this
// package does not implement fails at load with an error naming it.
func TestLoadRejectsUnsupported(t *testing.T) {
	base := `"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}`
	tests := []struct {
		name, json, want string
	}{
		{"unigram model", `{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}`, `"Unigram"`},
		{"wordpiece model", `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`, `"WordPiece"`},
		{"bert normalizer", `{"normalizer": {"type": "BertNormalizer"}, ` + base + `}`, `normalizer "BertNormalizer"`},
		{"char delimiter pre-tokenizer", `{"pre_tokenizer": {"type": "CharDelimiterSplit", "delimiter": "x"}, ` + base + `}`, `pre-tokenizer "CharDelimiterSplit"`},
		{"unknown post-processor", `{"post_processor": {"type": "Mystery"}, ` + base + `}`, `post-processor "Mystery"`},
		{"wordpiece decoder", `{"decoder": {"type": "WordPiece"}, ` + base + `}`, `decoder "WordPiece"`},
		{"dropout", `{"model": {"type": "BPE", "dropout": 0.1, "vocab": {"a": 0}, "merges": []}}`, "dropout"},
		{"merge outside vocab", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a z"]}}`, `"z" is not in the vocab`},
		{"bad regex", `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}, ` + base + `}`, "unsupported regex"},
		{"bad split behavior", `{"pre_tokenizer": {"type": "Split", "pattern": {"String": "x"}, "behavior": "Sideways"}, ` + base + `}`, `"Sideways"`},
		{"no model", `{"normalizer": null}`, "no model"},
		{"not json", `{"model": `, "json offset"},
		{"trailing data", `{` + base + `} x`, "after the top-level object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want it to mention %s", err, tc.want)
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("Load of an empty dir: %v", err)
	}
	path := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(path, []byte(`{"model": {"type": "Unigram"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("LoadFile error %v does not name %s", err, path)
	}
}

func TestEmptySequencesAreNoOps(t *testing.T) {
	tok, err := Parse([]byte(`{"normalizer": {"type": "Sequence", "normalizers": []},
		"pre_tokenizer": {"type": "Sequence", "pretokenizers": []},
		"post_processor": {"type": "Sequence", "processors": []},
		"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("abab", true); len(got) != 2 || got[0] != 2 || got[1] != 2 {
		t.Fatalf("Encode(abab) = %v, want [2 2]", got)
	}
}

func TestMergesInBothForms(t *testing.T) {
	for _, merges := range []string{`["a b", "ab c"]`, `[["a", "b"], ["ab", "c"]]`} {
		tok, err := Parse([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}, "merges": ` + merges + `}}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode("abc", false); len(got) != 1 || got[0] != 4 {
			t.Fatalf("merges %s: Encode(abc) = %v, want [4]", merges, got)
		}
	}
}
