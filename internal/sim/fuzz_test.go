package sim

import (
	"encoding/json"
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
			ids, _, err := w.prompt(body, req, chat, 16)
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

// FuzzScanIDs checks the fast token-id scanner against encoding/json: when
// it accepts input, encoding/json must decode the same ids.
func FuzzScanIDs(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, ` [ 0 , 7 ]`, `[]`, `[01]`, `[1.5]`, `[1e3]`, `[-1]`, `[2147483648]`, `[1,]`, `[1 2]`, `[1]x`, `[[1]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, ok := scanIDs(raw)
		if !ok {
			return
		}
		var want []int64
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("scanIDs accepted %q, encoding/json rejects it: %v", raw, err)
		}
		if len(want) != len(ids) {
			t.Fatalf("%q: %v vs %v", raw, ids, want)
		}
		for i := range ids {
			if int64(ids[i]) != want[i] {
				t.Fatalf("%q: %v vs %v", raw, ids, want)
			}
		}
	})
}
