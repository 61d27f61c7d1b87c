package sim

import (
	"encoding/json"
	"errors"
	"math"
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

// FuzzParseProfile feeds arbitrary bytes to the timing profile decoder.
// It must never panic; what it accepts has every coefficient finite and
// not negative, prices a step at a positive time (never NaN), and
// survives a round trip through its own JSON.
func FuzzParseProfile(f *testing.F) {
	for _, s := range []string{
		`{"name":"p","prefill":{"pass_ms":5,"per_token_ms":0.02,"attention_ms":1.5e-6,"context_ms":5e-4},"decode":{"step_ms":5,"kv_read_ms":5e-5}}`,
		`{"name":"p","prefill":{"pass_ms":5,"per_token_ms":0.02,"attention_ms":1.5e-6,"context_ms":5e-4},"decode":{"step_ms":5,"kv_read_ms":-1}}`,
		`{"name":"p","prefill":{"pass_ms":1e309},"decode":{}}`,
		`{"name":"p","fit":{"x":[1,2]},"notes":["a"]}`,
		`{"name":"p","prefill":null,"decode":null}`,
		`{} {}`, `[]`, `null`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	data, err := builtinFS.ReadFile("profiles/" + TimingH100Llama3_8B + ".json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	res := &StepResult{Scheduled: 3, PrefillTokens: 8192, PrefillAttention: 3e8, PrefillContext: 32768, DecodeTokens: 2, DecodeKVTokens: 1 << 20}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProfile(b)
		if err != nil {
			return
		}
		for _, v := range []float64{p.Prefill.PassMillis, p.Prefill.PerTokenMillis, p.Prefill.AttentionMillis,
			p.Prefill.ContextMillis, p.Decode.StepMillis, p.Decode.KVReadMillis} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("accepted coefficient %g in %+v", v, *p)
			}
		}
		if ms := p.StepMillis(res, 0); math.IsNaN(ms) || ms <= 0 {
			t.Fatalf("step priced at %g ms by %+v", ms, *p)
		}
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		q, err := ParseProfile(out)
		if err != nil || *q != *p {
			t.Fatalf("round trip of %s: %+v, %v", out, q, err)
		}
	})
}
