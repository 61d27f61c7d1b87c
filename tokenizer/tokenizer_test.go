package tokenizer

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// tinyTokenizerJSON is a complete byte-level BPE tokenizer small enough to
// reason about: bytes of "a", "b", " ", merges a+b and " "+ab, one special.
var tinyTokenizerJSON = func() string {
	var vocab []string
	for b := 0; b < 256; b++ {
		vocab = append(vocab, fmt.Sprintf("%q: %d", byteToStr[b], b))
	}
	vocab = append(vocab, `"ab": 256`, `"Ġab": 257`)
	return `{"version": "1.0",
 "added_tokens": [{"id": 258, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
 "normalizer": null,
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
 "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|end|>", "type_id": 0}}],
   "pair": [], "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [258], "tokens": ["<|end|>"]}}},
 "decoder": {"type": "ByteLevel"},
 "model": {"type": "BPE", "vocab": {` + strings.Join(vocab, ", ") + `}, "merges": ["a b", ["Ġ", "ab"]]}}`
}()

func TestTinyTokenizer(t *testing.T) {
	tok, err := Parse([]byte(tinyTokenizerJSON))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		text    string
		special bool
		want    []uint32
	}{
		{"merges apply in rank order", "ab ab", false, []uint32{256, 257}},
		{"unmerged bytes stay single", "ba", false, []uint32{'b', 'a'}},
		{"special token inside text", "ab<|end|>ab", false, []uint32{256, 258, 256}},
		{"post-processor appends EOS when asked", "ab", true, []uint32{256, 258}},
		{"empty text with special tokens", "", true, []uint32{258}},
		{"invalid UTF-8 reads as U+FFFD", "\xff", false, []uint32{0xEF, 0xBF, 0xBD}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tok.Encode(tc.text, tc.special); !slices.Equal(got, tc.want) {
				t.Fatalf("Encode(%q, %v) = %v, want %v", tc.text, tc.special, got, tc.want)
			}
		})
	}
	if got := tok.Decode([]uint32{256, 257, 258}); got != "ab ab<|end|>" {
		t.Fatalf("Decode = %q", got)
	}
}

func TestTokenLookups(t *testing.T) {
	tok := loadFamily(t, "llama3")
	id, ok := tok.TokenID("<|eot_id|>")
	if !ok || id != 128009 {
		t.Fatalf("TokenID(<|eot_id|>) = %d, %v; want 128009", id, ok)
	}
	if !tok.IsSpecial(id) {
		t.Fatal("<|eot_id|> is not special")
	}
	if s, ok := tok.TokenString(id); !ok || s != "<|eot_id|>" {
		t.Fatalf("TokenString(128009) = %q, %v", s, ok)
	}
	if id, ok := tok.TokenID("Ġthe"); !ok || tok.IsSpecial(id) {
		t.Fatalf("TokenID(Ġthe) = %d, %v, special=%v", id, ok, tok.IsSpecial(id))
	}
	if _, ok := tok.TokenString(1 << 30); ok {
		t.Fatal("TokenString of an unknown id succeeded")
	}
	if got := tok.Decode([]uint32{1 << 30}); got != "" {
		t.Fatalf("Decode of an unknown id = %q, want it skipped", got)
	}
	specials := tok.SpecialTokens()
	if len(specials) != 256 || specials[0].Content != "<|begin_of_text|>" || specials[0].ID != 128000 || !specials[0].Special {
		t.Fatalf("SpecialTokens()[0] = %+v (of %d)", specials[0], len(specials))
	}
	specials[0].Content = "mutated"
	if tok.SpecialTokens()[0].Content != "<|begin_of_text|>" {
		t.Fatal("SpecialTokens returned shared state")
	}
	if n := tok.VocabSize(); n != 128256 {
		t.Fatalf("VocabSize = %d, want 128256", n)
	}
}

// TestEncodeConcurrent encodes the same inputs from many goroutines at once
// (run with -race): results must equal the sequential ones.
func TestEncodeConcurrent(t *testing.T) {
	tok := loadFamily(t, "qwen3")
	inputs := []string{"Hello world, it's me.", "你好世界", "func f() { return 42 }", "  \n\n  x  ", "<|im_start|>user\nhi<|im_end|>"}
	want := make([][]uint32, len(inputs))
	for i, s := range inputs {
		want[i] = tok.Encode(s, false)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 50; k++ {
				i := (g + k) % len(inputs)
				if got := tok.Encode(inputs[i], false); !slices.Equal(got, want[i]) {
					errs <- fmt.Sprintf("goroutine %d: Encode(%q) = %v, want %v", g, inputs[i], got, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestCacheDoesNotChangeResults compares the cached and uncached tokenizer.
func TestCacheDoesNotChangeResults(t *testing.T) {
	tok := loadFamily(t, "llama3")
	raw := uncached(tok)
	for _, s := range []string{"the the the", "hello hello world", strings.Repeat("ab ", 100)} {
		a, b, c := tok.Encode(s, false), tok.Encode(s, false), raw.Encode(s, false)
		if !slices.Equal(a, c) || !slices.Equal(b, c) {
			t.Fatalf("cached %v / %v, uncached %v for %q", a, b, c, s)
		}
	}
}

func TestPieceCacheIsBounded(t *testing.T) {
	c := newPieceCache(4)
	for i := 0; i < 100; i++ {
		c.put(fmt.Sprint("piece", i), []uint32{uint32(i)})
	}
	n := 0
	for i := range c.slots {
		if c.slots[i].Load() != nil {
			n++
		}
	}
	if n > 4 {
		t.Fatalf("cache holds %d entries, bound is 4", n)
	}
	if ids, ok := c.get("piece99"); !ok || !slices.Equal(ids, []uint32{99}) {
		t.Fatalf("latest entry missing: %v %v", ids, ok)
	}
}
