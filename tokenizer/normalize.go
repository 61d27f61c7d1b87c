package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a segment of text before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

var (
	_ normalizer = unicodeNorm{}
	_ normalizer = lowercase{}
	_ normalizer = strip{}
	_ normalizer = prepend{}
	_ normalizer = replace{}
	_ normalizer = normSequence{}
)

type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string { return n.form.String(s) }

type lowercase struct{}

func (lowercase) normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == 'İ' {
			// Rust's char::to_lowercase maps U+0130 to two runes.
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

type strip struct{ left, right bool }

func (n strip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

type prepend struct{ prefix string }

func (n prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

type replace struct {
	pattern *matcher
	content string
}

func (n replace) normalize(s string) string { return n.pattern.replaceAll(s, n.content) }

type normSequence []normalizer

func (seq normSequence) normalize(s string) string {
	for _, n := range seq {
		s = n.normalize(s)
	}
	return s
}

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Prepend     string            `json:"prepend"`
	Pattern     patternJSON       `json:"pattern"`
	Content     string            `json:"content"`
	StripLeft   *bool             `json:"strip_left"`
	StripRight  *bool             `json:"strip_right"`
}

// parseNormalizer builds a normalizer; a Sequence with no members yields nil.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	var j normalizerJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Strip":
		return strip{left: j.StripLeft == nil || *j.StripLeft, right: j.StripRight == nil || *j.StripRight}, nil
	case "Prepend":
		return prepend{prefix: j.Prepend}, nil
	case "Replace":
		m, err := parsePattern(j.Pattern)
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		return replace{pattern: m, content: j.Content}, nil
	case "Sequence":
		member := func(r json.RawMessage) (normalizer, error) {
			if isNull(r) {
				return nil, nil
			}
			return parseNormalizer(r)
		}
		return parseSequence(j.Normalizers, member, func(s normSequence) normalizer { return s })
	case "":
		return nil, errors.New("normalizer without a type")
	default:
		return nil, fmt.Errorf("unsupported normalizer %q", j.Type)
	}
}
