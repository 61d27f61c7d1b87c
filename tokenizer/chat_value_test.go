package tokenizer

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// plain turns decoded values into what encoding/json produces, for comparison.
func plain(v any) any {
	switch t := v.(type) {
	case Object:
		m := map[string]any{}
		for _, f := range t {
			m[f.Key] = plain(f.Value)
		}
		return m
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = plain(e)
		}
		return out
	case int64:
		return float64(t)
	}
	return v
}

func TestDecodeJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, in := range []string{
		`{"a": [1, -2.5e3, 0, -0, 1E+2, true, false, null, "x\u00e9\ud83d\ude00\n\"\\\/"], "b": {}}`,
		`"\ud800 lone"`, "\"bad \xff utf8\"", `  [ ]  `, `-0.0`,
	} {
		got, err := DecodeJSON([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		var want any
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("%s: encoding/json: %v", in, err)
		}
		if g := plain(got); !reflect.DeepEqual(g, want) {
			t.Errorf("%s: got %#v, want %#v", in, g, want)
		}
	}
	for _, in := range []string{``, `{`, `{"a" 1}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `-`, `1e`, `tru`, `"a`, "\"a\x01\"", `"\x"`, `"\u12"`, `{1: 2}`, `[] []`, `nul`} {
		if _, err := DecodeJSON([]byte(in)); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// FuzzDecodeJSON checks the hand-written decoder against encoding/json:
// the same documents are valid and they decode to the same values.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"a": [1, 2.5, "x", null, true]}`, `"\ud83d\ude00"`, `[{"b": {"c": []}}, -0.5e-3]`, `{"a": 1, "a": 2}`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeJSON(data)
		valid := json.Valid(data)
		if err != nil {
			if valid && !strings.Contains(err.Error(), "nesting") {
				t.Fatalf("valid JSON %q rejected: %v", data, err)
			}
			return
		}
		if !valid {
			t.Fatalf("invalid JSON %q accepted", data)
		}
		var want any
		if err := json.Unmarshal(data, &want); err != nil {
			return // e.g. numbers out of float64 range, which Python reads as inf
		}
		if g := plain(got); !reflect.DeepEqual(g, want) {
			t.Fatalf("%q: got %#v, want %#v", data, g, want)
		}
	})
}
