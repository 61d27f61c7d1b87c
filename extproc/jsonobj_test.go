package extproc

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

var jsonSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi \u00e9\n\"q\""}],"n":1,"t":0.5,"big":12345678901234567890,"neg":-0,"e":1e400,"x":null,"b":[true,false,[],{}]}`,
	`{"a":1,"b":2,"a":3}`,
	`[1,2,3]`, `"s"`, ` 42 `, `{"a":"\ud83d\ude00 invalid \ud800"}`, "{\"a\":\"\xff\xfe\"}",
	`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a" 1}`, `{"a":1,}`, `[1,]`, `{"a":tru}`, `{} x`, "\"a\tb\"", `"\x"`, ``,
	strings.Repeat("[", 600) + strings.Repeat("]", 600),
}

func TestDecodeJSONMatchesTokenizer(t *testing.T) {
	for _, s := range jsonSeeds {
		checkSameJSON(t, []byte(s))
	}
}

func FuzzDecodeJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkSameJSON(t, data) })
}

func checkSameJSON(t *testing.T, data []byte) {
	t.Helper()
	want, werr := tokenizer.DecodeJSON(data)
	got, gerr := decodeJSON(data)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%q: tokenizer err %v, ours %v", data, werr, gerr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: got %#v, want %#v", data, got, want)
	}
}

func BenchmarkDecodeJSONChat8k(b *testing.B) {
	_, body := benchBody("chat_8k", 1)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeJSON(body); err != nil {
			b.Fatal(err)
		}
	}
}

func TestHasControl(t *testing.T) {
	for n := range 20 {
		for pos := range n {
			for _, c := range []byte{0x00, 0x1f, 0x20, 0x7f, 0x80, 0xff, 'a'} {
				b := []byte(strings.Repeat("x", n))
				b[pos] = c
				if got, want := hasControl(b), c < 0x20; got != want {
					t.Fatalf("hasControl(%q) = %v, want %v", b, got, want)
				}
			}
		}
	}
}

// BenchmarkTokenizerDecodeJSONChat8k is the same body through
// tokenizer.DecodeJSON: the reason this package keeps its own decoder is
// the gap between the two (~1.7x on these machines when written).
func BenchmarkTokenizerDecodeJSONChat8k(b *testing.B) {
	_, body := benchBody("chat_8k", 1)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tokenizer.DecodeJSON(body); err != nil {
			b.Fatal(err)
		}
	}
}
