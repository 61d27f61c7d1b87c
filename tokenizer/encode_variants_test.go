package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// variant is one entry of testdata/variants/variants.json: a base family's
// tokenizer.json with members overridden, model fields patched and added
// tokens appended. gen/encode.mjs builds the same tokenizers for the reference.
type variant struct {
	Name     string                     `json:"name"`
	Base     string                     `json:"base"`
	Override map[string]json.RawMessage `json:"override"`
	Model    map[string]json.RawMessage `json:"model"`
	Extra    []json.RawMessage          `json:"extra_tokens"`
}

// buildVariant assembles a variant's tokenizer.json.
func buildVariant(tb testing.TB, v variant) []byte {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", v.Base, "tokenizer.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		tb.Fatal(err)
	}
	for k, raw := range v.Override {
		doc[k] = raw
	}
	if len(v.Model) > 0 {
		var model map[string]json.RawMessage
		if err := json.Unmarshal(doc["model"], &model); err != nil {
			tb.Fatal(err)
		}
		for k, raw := range v.Model {
			model[k] = raw
		}
		doc["model"] = mustMarshal(tb, model)
	}
	if len(v.Extra) > 0 {
		var added []json.RawMessage
		if err := json.Unmarshal(doc["added_tokens"], &added); err != nil {
			tb.Fatal(err)
		}
		doc["added_tokens"] = mustMarshal(tb, append(added, v.Extra...))
	}
	return mustMarshal(tb, doc)
}

func mustMarshal(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func readVariants(tb testing.TB) []variant {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "variants", "variants.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var vs []variant
	if err := json.Unmarshal(data, &vs); err != nil {
		tb.Fatal(err)
	}
	return vs
}

// TestVariantsMatchReference pins every component that the four real
// families do not use (Metaspace, Digits, Punctuation, Whitespace,
// WhitespaceSplit, every Split behaviour and invert, NFKC, NFD, Lowercase,
// Strip, regex Replace, ByteLevel with prefix space and GPT-2 regex, a
// ByteLevel step that is not last, added tokens with lstrip, rstrip,
// single_word and normalized, TemplateProcessing with BOS and EOS, and the
// Metaspace, Replace, Strip decoders) against the reference, ids and text.
func TestVariantsMatchReference(t *testing.T) {
	vs := readVariants(t)
	if len(vs) == 0 {
		t.Fatal("no variants")
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			tok, err := Parse(buildVariant(t, v))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			cases := readGoldenFile(t, filepath.Join("testdata", "golden", "variants", v.Name+".jsonl.gz"))
			if n := checkGolden(t, tok, cases); n < 1000 {
				t.Fatalf("only %d golden cases", n)
			}
		})
	}
}
