package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns token strings back into text pieces, as the reference's
// decode_chain does; the pieces are joined at the end.
type decoder interface {
	decode(tokens []string) []string
}

var (
	_ decoder = byteLevelDecoder{}
	_ decoder = metaspaceDecoder{}
	_ decoder = byteFallbackDecoder{}
	_ decoder = fuseDecoder{}
	_ decoder = stripDecoder{}
	_ decoder = replaceDecoder{}
	_ decoder = decoderSequence{}
)

// byteLevelDecoder maps byte-level runes back to bytes; tokens outside the
// alphabet (added tokens) keep their own bytes. Invalid UTF-8 becomes U+FFFD.
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(tokens []string) []string {
	var b []byte
	for _, t := range tokens {
		var ok bool
		if b, ok = appendByteLevelDecoded(b, t); !ok {
			b = append(b, t...)
		}
	}
	return []string{lossyUTF8(b)}
}

// metaspaceDecoder turns the replacement rune back into spaces and drops the
// prefix space of the first token unless the scheme never prepends.
type metaspaceDecoder struct {
	replacement rune
	prepend     string
}

func (d metaspaceDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		var b strings.Builder
		for _, r := range t {
			if r == d.replacement {
				if i == 0 && d.prepend != "never" {
					continue
				}
				r = ' '
			}
			b.WriteRune(r)
		}
		out[i] = b.String()
	}
	return out
}

// byteFallbackDecoder turns runs of <0xXX> tokens into the UTF-8 text they
// spell, or one U+FFFD per byte when they do not spell valid UTF-8.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decode(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if v, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				pending = append(pending, byte(v))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) decode(tokens []string) []string { return []string{strings.Join(tokens, "")} }

// stripDecoder removes up to start leading and stop trailing copies of content
// from every token.
type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rs := []rune(t)
		lo, hi := 0, len(rs)
		for k := 0; k < d.start && k < len(rs) && rs[k] == d.content; k++ {
			lo = k + 1
		}
		for k := 0; k < d.stop && len(rs)-k-1 >= lo && rs[len(rs)-k-1] == d.content; k++ {
			hi = len(rs) - k - 1
		}
		out[i] = string(rs[lo:hi])
	}
	return out
}

type replaceDecoder struct {
	pattern *matcher
	content string
}

func (d replaceDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = d.pattern.replaceAll(t, d.content)
	}
	return out
}

type decoderSequence []decoder

func (s decoderSequence) decode(tokens []string) []string {
	for _, d := range s {
		tokens = d.decode(tokens)
	}
	return tokens
}

type decoderJSON struct {
	Type           string            `json:"type"`
	Decoders       []json.RawMessage `json:"decoders"`
	Pattern        patternJSON       `json:"pattern"`
	Content        string            `json:"content"`
	Start          int               `json:"start"`
	Stop           int               `json:"stop"`
	Replacement    string            `json:"replacement"`
	PrependScheme  string            `json:"prepend_scheme"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	var j decoderJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Metaspace":
		ms, err := parseMetaspace(j.Replacement, j.PrependScheme, j.AddPrefixSpace, nil)
		if err != nil {
			return nil, err
		}
		return metaspaceDecoder{replacement: ms.replacement, prepend: ms.prepend}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
		r, n := utf8.DecodeRuneInString(j.Content)
		if n == 0 || n != len(j.Content) {
			return nil, fmt.Errorf("Strip content %q is not one character", j.Content)
		}
		return stripDecoder{content: r, start: j.Start, stop: j.Stop}, nil
	case "Replace":
		m, err := parsePattern(j.Pattern)
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		return replaceDecoder{pattern: m, content: j.Content}, nil
	case "Sequence":
		var seq decoderSequence
		for i, r := range j.Decoders {
			d, err := parseDecoder(r)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			seq = append(seq, d)
		}
		return seq, nil
	case "":
		return nil, errors.New("decoder without a type")
	default:
		return nil, fmt.Errorf("unsupported decoder %q", j.Type)
	}
}

// lossyUTF8 is Rust's String::from_utf8_lossy: each maximal invalid
// subsequence becomes one U+FFFD.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			sb.Write(b[i : i+n])
			i += n
			continue
		}
		sb.WriteString("\uFFFD")
		i += maximalSubpart(b[i:])
	}
	return sb.String()
}

// maximalSubpart returns the length of the invalid sequence at b[0]: the
// lead byte plus the continuation bytes that could still have completed it.
func maximalSubpart(b []byte) int {
	lo, hi, need := byte(0x80), byte(0xBF), 0
	switch c := b[0]; {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		lo, need = 0xA0, 2
	case c == 0xED:
		hi, need = 0x9F, 2
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		lo, need = 0x90, 3
	case c == 0xF4:
		hi, need = 0x8F, 3
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		if b[n] < lo || b[n] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
		n++
	}
	return n
}
