package tokenizer

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
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

var (
	baseDocsMu sync.Mutex
	baseDocs   = map[string]map[string]json.RawMessage{}
)

// baseDoc splits a family's tokenizer.json into members, once per base.
func baseDoc(tb testing.TB, base string) map[string]json.RawMessage {
	tb.Helper()
	baseDocsMu.Lock()
	defer baseDocsMu.Unlock()
	if doc, ok := baseDocs[base]; ok {
		return doc
	}
	data, err := os.ReadFile(filepath.Join("testdata", base, "tokenizer.json"))
	if err != nil {
		tb.Fatal(err)
	}
	doc := map[string]json.RawMessage{}
	s := &jsonScanner{data: data}
	if err := s.object(func(key string) error {
		raw, err := s.skip()
		doc[key] = raw
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	baseDocs[base] = doc
	return doc
}

// buildVariant assembles a variant's tokenizer.json. Model fields are
// patched by appending them to the model object: a repeated key's last
// value wins, as in encoding/json.
func buildVariant(tb testing.TB, v variant) []byte {
	tb.Helper()
	doc := maps.Clone(baseDoc(tb, v.Base))
	for k, raw := range v.Override {
		doc[k] = raw
	}
	if len(v.Model) > 0 {
		model := bytes.TrimSpace(doc["model"])
		patched := append([]byte{}, model[:len(model)-1]...)
		for k, raw := range v.Model {
			patched = append(strconv.AppendQuote(append(patched, ','), k), ':')
			patched = append(patched, raw...)
		}
		doc["model"] = append(patched, '}')
	}
	if len(v.Extra) > 0 {
		added := bytes.TrimSpace(doc["added_tokens"])
		patched := append([]byte{}, added[:len(added)-1]...)
		for _, raw := range v.Extra {
			if len(patched) > 1 {
				patched = append(patched, ',')
			}
			patched = append(patched, raw...)
		}
		doc["added_tokens"] = append(patched, ']')
	}
	out := []byte{'{'}
	for k, raw := range doc {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(strconv.AppendQuote(out, k), ':')
		out = append(out, raw...)
	}
	return append(out, '}')
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
