package sim

import (
	"errors"
	"slices"
	"testing"
)

func TestParsePromptForms(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		text    string
		ids     []int32
		wantErr bool
	}{
		{"text", `"hello"`, "hello", nil, false},
		{"token ids", `[1, 2, 3]`, "", []int32{1, 2, 3}, false},
		{"token ids with spaces", ` [ 7 ,8]`, "", []int32{7, 8}, false},
		{"one list of ids", `[[4,5]]`, "", []int32{4, 5}, false},
		{"one text in a list", `["hi"]`, "hi", nil, false},
		{"two prompts", `["a","b"]`, "", nil, true},
		{"empty ids", `[]`, "", nil, true},
		{"negative id", `[-1]`, "", nil, true},
		{"id beyond int32", `[4294967296]`, "", nil, true},
		{"fractional id", `[1.5]`, "", nil, true},
		{"object", `{"a":1}`, "", nil, true},
		{"null", `null`, "", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parsePrompt([]byte(tt.raw))
			if tt.wantErr {
				if !errors.Is(err, errBadRequest) {
					t.Fatalf("err = %v, want errBadRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.text != tt.text || !slices.Equal(p.tokens, tt.ids) || p.isIDs != (tt.ids != nil) {
				t.Fatalf("got %+v", p)
			}
		})
	}
}
