package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
	"unsafe"

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

type unicodeNorm struct {
	form  norm.Form
	inert *inertRunes // nil: check every non-ASCII run with the form
}

// inertRunes is a bit per BMP rune that the form leaves as it is and that
// combines with nothing on its left (letters of most scripts, precomposed
// or not, CJK ideographs; not combining marks, Hangul jamo or compatibility
// characters). In a run made only of such runes, followed by ASCII or the
// end of the text, nothing can compose, reorder or decompose, so the run
// needs no check.
type inertRunes [0x10000 / 64]uint64

func (t *inertRunes) has(r rune) bool { return r < 0x10000 && t[r>>6]&(1<<(r&63)) != 0 }

var inertTables [4]struct {
	once sync.Once
	t    *inertRunes
}

// newUnicodeNorm returns the normalizer of form, with its table of inert
// runes (built once per form and process).
func newUnicodeNorm(form norm.Form) unicodeNorm {
	e := &inertTables[form]
	e.once.Do(func() {
		t := new(inertRunes)
		for r := rune(0x80); r < 0x10000; r++ {
			if r >= 0xD800 && r < 0xE000 {
				continue
			}
			str := string(r)
			p := form.PropertiesString(str)
			if p.BoundaryBefore() && form.IsNormalString(str) {
				t[r>>6] |= 1 << (r & 63)
			}
		}
		e.t = t
	})
	return unicodeNorm{form: form, inert: e.t}
}

// normalize puts s in the form, touching only the runs of non-ASCII text
// (each with the ASCII byte before it) and skipping ASCII eight bytes at a
// time. ASCII is the same in every form and never combines with the
// character before it, so every ASCII byte is a boundary the form cannot
// move text across, and each run can be normalized on its own.
func (n unicodeNorm) normalize(s string) string {
	var it norm.Iter
	out, changed := n.appendNormalized(nil, s, &it)
	if !changed {
		return s
	}
	return string(out)
}

// normalizeScratch is normalize writing into st's buffer, reused from call
// to call, instead of a new string: the result, when s changes, is only
// valid until st normalizes again or goes back to the pool.
func (n unicodeNorm) normalizeScratch(st *encodeState, s string) string {
	if st.normIter == nil {
		st.normIter = new(norm.Iter)
	}
	out, changed := n.appendNormalized(st.normBuf[:0], s, st.normIter)
	if !changed {
		return s
	}
	st.normBuf = out
	return unsafe.String(unsafe.SliceData(out), len(out))
}

// appendNormalized appends s in the form to out and reports whether it
// differs from s; when it does not, out is returned unchanged. it holds the
// normalizer's state, so a reused one makes normalizing allocate nothing.
func (n unicodeNorm) appendNormalized(out []byte, s string, it *norm.Iter) ([]byte, bool) {
	base := len(out)
	changed := false
	done := 0 // s[:done] is in out (when changed)
	for i := 0; ; {
		i = skipASCII(s, i)
		if i == len(s) {
			break
		}
		start := max(i-1, 0)
		for i < len(s) && s[i] >= utf8.RuneSelf {
			i++
		}
		run := s[start:i]
		if n.allInert(run) || n.form.QuickSpanString(run) == len(run) {
			continue
		}
		if !changed {
			changed = true
			out = slices.Grow(out, len(s)+len(s)/8)
		}
		out = append(out, s[done:start]...)
		it.InitString(n.form, run)
		for !it.Done() {
			out = append(out, it.Next()...)
		}
		done = i
	}
	if !changed {
		return out[:base], false
	}
	return append(out, s[done:]...), true
}

// allInert reports whether every rune of s is ASCII or inert.
func (n unicodeNorm) allInert(s string) bool {
	if n.inert == nil {
		return false
	}
	for i := 0; i < len(s); {
		r, size := decode(s, i)
		if r >= utf8.RuneSelf && !n.inert.has(r) {
			return false
		}
		i += size
	}
	return true
}

// skipASCII returns the index of the first non-ASCII byte of s at or after
// i, or len(s).
func skipASCII(s string, i int) int {
	for ; i+8 <= len(s); i += 8 {
		// The byte-wise load below compiles to one 8-byte load.
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if w&0x8080808080808080 != 0 {
			break
		}
	}
	for i < len(s) && s[i] < utf8.RuneSelf {
		i++
	}
	return i
}

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
		return newUnicodeNorm(norm.NFC), nil
	case "NFD":
		return newUnicodeNorm(norm.NFD), nil
	case "NFKC":
		return newUnicodeNorm(norm.NFKC), nil
	case "NFKD":
		return newUnicodeNorm(norm.NFKD), nil
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
