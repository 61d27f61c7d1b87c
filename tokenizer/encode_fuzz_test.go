package tokenizer

import (
	"encoding/binary"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var fuzzSeeds = []string{
	"", " ", "Hello world", "It's DON'T we'LL", "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n",
	"12345678901234567890", "你好，世界。日本語のテキスト", "Привет, мир", "مرحبا بالعالم", "नमस्ते दुनिया",
	"สวัสดีชาวโลก", "👨‍👩‍👧‍👦👍🏽🇺🇸", "e\u0301 a\u0308", "<|begin_of_text|><|im_start|><s></s><｜end▁of▁sentence｜>",
	"<|im_start", "\xff\xfe invalid \xc3", "\u200d\u200b\ufeff", "func main() { fmt.Println(\"x\") }",
}

// FuzzEncode checks that Encode never panics on any input for any family,
// that Decode never panics on any ids, and that byte-level models round-trip:
// Decode(Encode(s)) == s for valid UTF-8 (NFC(s) where the model applies NFC).
func FuzzEncode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	toks := make(map[string]*Tokenizer, len(families))
	for _, fam := range families {
		toks[fam] = loadFamily(f, fam)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, fam := range families {
			tok := toks[fam]
			plain := tok.Encode(s, false)
			withSpecial := tok.Encode(s, true)
			if len(withSpecial) < len(plain) {
				t.Fatalf("%s: adding special tokens shortened %q", fam, s)
			}
			decoded := tok.Decode(plain)
			if fam == "mistral-sp" || !utf8.ValidString(s) {
				continue
			}
			want := s
			if fam == "qwen3" {
				want = norm.NFC.String(s)
			}
			if decoded != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", fam, s, decoded)
			}
		}
		// Arbitrary ids, including unknown ones, must decode without panicking.
		ids := make([]uint32, 0, len(s)/4)
		for b := []byte(s); len(b) >= 4; b = b[4:] {
			ids = append(ids, binary.LittleEndian.Uint32(b)%200000)
		}
		for _, fam := range families {
			toks[fam].Decode(ids)
		}
	})
}

// FuzzParse feeds arbitrary bytes to the tokenizer.json decoder: bad input
// must come back as an error, never a panic.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		tinyTokenizerJSON, `{}`, `{"model": null}`, `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`,
		`{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}`, `[1, 2]`, `{"model": {"vocab": {"a": -1}}}`,
		`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}}}`,
		"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\ud800\": 0}, \"merges\": []}}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := Parse(data)
		if err != nil {
			return
		}
		// A file that loads must encode and decode without panicking.
		tok.Decode(tok.Encode("Hello, world! 123 你好 <s>", true))
	})
}
