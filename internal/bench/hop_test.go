package bench

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// The hop benchmark runs end to end at a low rate: both paths answer every
// request, the routed path really goes through kvroute (the router counted
// the prompt's tokens), and the baseline's bootstrap has no ext_proc.
func TestHopMeasuresBothPaths(t *testing.T) {
	rep, err := RunHop(context.Background(), HopConfig{Workers: 2, TokenizerDir: "../../tokenizer/testdata/qwen3",
		Rates: []float64{50}, Duration: 400 * time.Millisecond, Rounds: 1, Prompts: []string{"short"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rep.Rows))
	}
	r := rep.Rows[0]
	for name, st := range map[string]HopStats{"baseline": r.Baseline, "routed": r.Routed} {
		if st.Sent < 10 || st.Errors != 0 || st.P50Ms <= 0 || st.P99Ms < st.P50Ms {
			t.Errorf("%s: %+v, want ≥ 10 sent, no errors, 0 < p50 ≤ p99", name, st)
		}
	}
	if rep.Decisions != r.Routed.Sent {
		t.Errorf("kvroute routed %d requests, the routed path sent %d and the baseline %d", rep.Decisions, r.Routed.Sent, r.Baseline.Sent)
	}
	if rep.PromptTokens["short"] < 5 {
		t.Errorf("the router counted %d prompt tokens for the short chat", rep.PromptTokens["short"])
	}
	if !bytes.Contains([]byte(rep.Markdown()), []byte("| short (")) {
		t.Errorf("markdown has no short row:\n%s", rep.Markdown())
	}
}
