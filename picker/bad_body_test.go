package picker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
)

// A body the router refuses says why: valid JSON nested past the decoder's
// limit is not "not a valid JSON object".
func TestBadBodyMessageNamesTheReason(t *testing.T) {
	deep := func(levels int) string {
		return `{"model":"` + testModel + `","x":` + strings.Repeat("[", levels) + strings.Repeat("]", levels) + `}`
	}
	tests := []struct {
		name, body, want string
	}{
		{"syntax error", `{"model":`, "not a valid JSON object"},
		{"nested past the limit", deep(tokenizer.MaxJSONDepth + 10), "deeper than the router's limit of 512 levels"},
	}
	rg := newRig(t, func(*scoring.Options, *Config) {})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rg.picker.Decide(context.Background(), chatReq(tt.body))
			var he *extproc.HTTPError
			if !errors.As(err, &he) || he.Status != 400 || he.Code != "invalid_body" {
				t.Fatalf("err = %v, want a 400 invalid_body", err)
			}
			if !strings.Contains(he.Message, tt.want) {
				t.Errorf("message %q, want it to say %q", he.Message, tt.want)
			}
		})
	}
	// Just under the limit is an ordinary request.
	if _, err := rg.picker.Decide(context.Background(), chatReq(deep(tokenizer.MaxJSONDepth-2))); err != nil {
		t.Errorf("a body nested within the limit: %v", err)
	}
}
