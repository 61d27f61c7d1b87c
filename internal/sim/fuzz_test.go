package sim

import (
	"errors"
	"testing"
)

// FuzzParseRequest feeds arbitrary bodies through the request edge: parsing,
// prompt extraction (text or token ids) and byte-encoded chat. Bad input
// must give an errBadRequest, never a panic.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":3}`,
		`{"prompt":[1,2,3],"stream":true}`,
		`{"prompt":[[1,2]]}`,
		`{"prompt":["x"]}`,
		`{"prompt":[-1]}`,
		`{"prompt":[99999999999]}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
		`{"max_tokens":-5}`,
		`[]`, `null`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	w := &Worker{encoder: ByteEncoder{}}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseAPIRequest(body)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if n, err := req.maxTokens(16); err == nil && n < 1 {
			t.Fatalf("max_tokens %d accepted", n)
		}
		for _, chat := range []bool{false, true} {
			ids, err := w.prompt(body, req, chat)
			if err != nil {
				if !errors.Is(err, errBadRequest) {
					t.Fatalf("unclassified error %v", err)
				}
				continue
			}
			for _, id := range ids {
				if id < 0 {
					t.Fatalf("negative token id %d", id)
				}
			}
		}
	})
}
