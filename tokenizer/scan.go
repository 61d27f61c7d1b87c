package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// scanFunc reports the end of the match that the pattern finds at s[i:], or
// -1 when it finds none there. It encodes the pattern's leftmost-first
// alternation and backtracking for that one starting position.
type scanFunc func(s string, i int) int

// skipFunc returns the first position from i on where its pattern may
// match, or len(s): every position it passes over would, stepping one rune
// at a time, have found no match. It returns a position that rune-by-rune
// stepping from i would reach, even in invalid UTF-8.
type skipFunc func(s string, i int) int

// matcher finds the matches of a Split or Replace pattern: a literal string,
// a hand-written scanner for the regexes real models use, or regexp2 (which
// has lookahead) for any other regex.
type matcher struct {
	source  string
	literal bool
	scan    scanFunc
	skip    skipFunc // nil: a match may start at any rune
	re      *regexp2.Regexp
}

// parsePattern builds the matcher of a {"String"} or {"Regex"} pattern.
func parsePattern(p patternJSON) (*matcher, error) {
	switch {
	case p.String != nil:
		if *p.String == "" {
			return nil, errors.New("empty String pattern")
		}
		return &matcher{source: *p.String, literal: true}, nil
	case p.Regex != nil:
		return compileRegex(*p.Regex)
	}
	return nil, errors.New("pattern has neither String nor Regex")
}

// compileRegex returns a hand-written scanner when the regex is one we know,
// and a regexp2 matcher otherwise.
func compileRegex(src string) (*matcher, error) {
	if scan, ok := knownScanners[src]; ok {
		return &matcher{source: src, scan: scan, skip: knownSkips[src]}, nil
	}
	re, err := regexp2.Compile(src, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("unsupported regex %q: %w", src, err)
	}
	return &matcher{source: src, re: re}, nil
}

// findAll appends the [start, end) byte offsets of the non-overlapping
// matches of m in s to dst, scanning left to right as the reference engine
// does. Empty matches are dropped.
func (m *matcher) findAll(s string, dst []int) []int {
	switch {
	case m.literal:
		for i := 0; i <= len(s)-len(m.source); {
			k := strings.Index(s[i:], m.source)
			if k < 0 {
				break
			}
			dst = append(dst, i+k, i+k+len(m.source))
			i += k + len(m.source)
		}
		return dst
	case m.scan != nil:
		for i := 0; i < len(s); {
			e := m.scan(s, i)
			if e > i {
				dst = append(dst, i, e)
				i = e
				continue
			}
			_, n := utf8.DecodeRuneInString(s[i:])
			i += n
		}
		return dst
	default:
		return m.findAllRegexp2(s, dst)
	}
}

// findAllRegexp2 runs the regexp2 fallback; its offsets count runes, so they
// are mapped back to bytes.
func (m *matcher) findAllRegexp2(s string, dst []int) []int {
	runes := []rune(s)
	offs := make([]int, len(runes)+1)
	b := 0
	for i, r := range runes {
		offs[i] = b
		b += utf8.RuneLen(r)
	}
	offs[len(runes)] = b
	match, err := m.re.FindRunesMatch(runes)
	for err == nil && match != nil {
		if match.Length > 0 {
			dst = append(dst, offs[match.Index], offs[match.Index+match.Length])
		}
		match, err = m.re.FindNextMatch(match)
	}
	return dst
}

// replaceAll replaces every match of m in s by content.
func (m *matcher) replaceAll(s, content string) string {
	if m.literal {
		return strings.ReplaceAll(s, m.source, content)
	}
	locs := m.findAll(s, nil)
	if len(locs) == 0 {
		return s
	}
	var b strings.Builder
	prev := 0
	for k := 0; k < len(locs); k += 2 {
		b.WriteString(s[prev:locs[k]])
		b.WriteString(content)
		prev = locs[k+1]
	}
	b.WriteString(s[prev:])
	return b.String()
}
