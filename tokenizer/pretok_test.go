package tokenizer

import (
	"slices"
	"testing"
)

// TestSplitBehaviours uses the examples of the reference's documentation for
// SplitDelimiterBehavior, splitting "the-final--countdown" on "-".
func TestSplitBehaviours(t *testing.T) {
	tests := []struct {
		behavior splitBehavior
		invert   bool
		want     []string
	}{
		{removed, false, []string{"the", "final", "countdown"}},
		{isolated, false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{mergedWithPrevious, false, []string{"the-", "final-", "-", "countdown"}},
		{mergedWithNext, false, []string{"the", "-final", "-", "-countdown"}},
		{contiguous, false, []string{"the", "-", "final", "--", "countdown"}},
		{removed, true, []string{"-", "-", "-"}},
	}
	m := &matcher{source: "-", literal: true}
	for _, tc := range tests {
		s := "the-final--countdown"
		got := splitSpans(s, m.findAll(s, nil), tc.invert, tc.behavior, true, nil)
		var texts []string
		for _, p := range got {
			texts = append(texts, p.text)
		}
		if !slices.Equal(texts, tc.want) {
			t.Errorf("behavior %d invert %v: %q, want %q", tc.behavior, tc.invert, texts, tc.want)
		}
	}
}
