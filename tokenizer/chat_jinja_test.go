package tokenizer

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTemplateEngineMatchesPythonJinja2 renders constructs that real chat
// templates use and compares with Python's Jinja2 in transformers' setup
// (testdata/chat/jinja/expected.jsonl, written by render.py beside it).
func TestTemplateEngineMatchesPythonJinja2(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "chat", "jinja", "expected.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		var row []json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil || len(row) != 5 {
			t.Fatalf("bad golden line %q: %v", sc.Text(), err)
		}
		var name, src string
		var want, wantErr *string
		for i, dst := range []any{&name, &src} {
			if err := json.Unmarshal(row[i], dst); err != nil {
				t.Fatal(err)
			}
		}
		if err := json.Unmarshal(row[3], &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(row[4], &wantErr); err != nil {
			t.Fatal(err)
		}
		rawVars, err := DecodeJSON(row[2])
		if err != nil {
			t.Fatal(err)
		}
		vars := map[string]any{}
		for _, f := range rawVars.(Object) {
			vars[f.Key] = f.Value
		}
		n++
		t.Run(name, func(t *testing.T) {
			tpl, err := ParseTemplate(src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tpl.Render(vars)
			if wantErr != nil {
				// raise_exception gives a TemplateError with the template's
				// text; Python's TypeErrors come back as render errors that
				// carry Python's message.
				var te *TemplateError
				if errors.As(err, &te) {
					if te.Message != *wantErr {
						t.Fatalf("template error %q, want %q", te.Message, *wantErr)
					}
				} else if err == nil || !strings.Contains(err.Error(), *wantErr) {
					t.Fatalf("err = %v, want one carrying %q", err, *wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			if got != *want {
				t.Fatalf("template %q\n got: %q\nwant: %q", src, got, *want)
			}
		})
	}
	if err := sc.Err(); err != nil || n == 0 {
		t.Fatalf("read goldens: %v (%d cases)", err, n)
	}
}
