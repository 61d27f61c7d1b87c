package tokenizer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepth bounds nesting so that hostile bodies cannot exhaust the stack.
const maxJSONDepth = 512

// MaxJSONDepth is how deeply DecodeJSON lets objects and arrays nest.
const MaxJSONDepth = maxJSONDepth

// ErrJSONTooDeep is wrapped by DecodeJSON's error for a document nested
// deeper than MaxJSONDepth: valid JSON, refused to bound the stack.
var ErrJSONTooDeep = fmt.Errorf("nesting deeper than %d levels", maxJSONDepth)

// DecodeJSON decodes one JSON document (RFC 8259) into the values described
// on Object, keeping object key order; duplicate keys keep the last value at
// the first position, as Python's json.loads does. Invalid UTF-8 in strings
// becomes U+FFFD. Trailing data after the document is an error.
func DecodeJSON(data []byte) (any, error) {
	d := jsonDecoder{data: data}
	return d.document()
}

func (d *jsonDecoder) document() (any, error) {
	d.skipSpace()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.pos != len(d.data) {
		return nil, d.errorf("unexpected data after the top-level value")
	}
	return v, nil
}

// jsonDecoder is a single-pass JSON reader: chat bodies are decoded on every
// routed request, and encoding/json's token API is several times slower.
type jsonDecoder struct {
	data []byte
	pos  int
	// trackImages makes the decoder note where each image content part
	// ({"type": "image_url", ...}) starts, in imageAt, keyed by the
	// object's first field, so that ParseRequest can give each ImagePart
	// its place in the body without a second pass.
	trackImages bool
	imageAt     map[*Field]int
}

// noteImage records obj's start when it is an image content part.
func (d *jsonDecoder) noteImage(obj Object, start int) {
	if typ, _ := obj.Get("type"); typ != "image_url" {
		return
	}
	if d.imageAt == nil {
		d.imageAt = map[*Field]int{}
	}
	d.imageAt[&obj[0]] = start
}

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("json: "+format+" (offset %d)", append(args, d.pos)...)
}

func (d *jsonDecoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (any, error) {
	if d.pos >= len(d.data) {
		return nil, d.errorf("unexpected end of input")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		return d.string()
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	default:
		return nil, d.errorf("unexpected character %q", c)
	}
}

func (d *jsonDecoder) literal(word string) error {
	if !bytes.HasPrefix(d.data[d.pos:], []byte(word)) {
		return d.errorf("invalid literal")
	}
	d.pos += len(word)
	return nil
}

func (d *jsonDecoder) object(depth int) (any, error) {
	if depth >= maxJSONDepth {
		return nil, d.errorf("%w", ErrJSONTooDeep)
	}
	start := d.pos
	d.pos++ // {
	obj := Object{}
	var index map[string]int // built once an object is large, so duplicates stay cheap to find
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return obj, nil
	}
	for {
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.errorf("expected a string key")
		}
		key, err := d.string()
		if err != nil {
			return nil, err
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, d.errorf("expected ':' after an object key")
		}
		d.pos++
		d.skipSpace()
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		if index == nil && len(obj) >= 16 {
			index = make(map[string]int, 2*len(obj))
			for i, f := range obj {
				if _, dup := index[f.Key]; !dup {
					index[f.Key] = i
				}
			}
		}
		if index != nil {
			if i, ok := index[key]; ok {
				obj[i].Value = v
			} else {
				index[key] = len(obj)
				obj = append(obj, Field{key, v})
			}
		} else {
			obj.Set(key, v)
		}
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, d.errorf("unexpected end of input in an object")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
			d.skipSpace()
		case '}':
			d.pos++
			if d.trackImages {
				d.noteImage(obj, start)
			}
			return obj, nil
		default:
			return nil, d.errorf("expected ',' or '}' in an object")
		}
	}
}

func (d *jsonDecoder) array(depth int) (any, error) {
	if depth >= maxJSONDepth {
		return nil, d.errorf("%w", ErrJSONTooDeep)
	}
	d.pos++ // [
	list := []any{}
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return list, nil
	}
	for {
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		list = append(list, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, d.errorf("unexpected end of input in an array")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
			d.skipSpace()
		case ']':
			d.pos++
			return list, nil
		default:
			return nil, d.errorf("expected ',' or ']' in an array")
		}
	}
}

// string reads a quoted string; the fast path copies it once.
func (d *jsonDecoder) string() (string, error) {
	d.pos++ // opening quote
	start := d.pos
	// Fast path for the common string (no escape, no control character,
	// valid UTF-8): find the closing quote with IndexByte and check the
	// bytes before it in bulk. Message contents are most of a chat body.
	if end := bytes.IndexByte(d.data[start:], '"'); end >= 0 {
		raw := d.data[start : start+end]
		if bytes.IndexByte(raw, '\\') < 0 && !hasControl(raw) && utf8.Valid(raw) {
			d.pos = start + end + 1
			return string(raw), nil
		}
	}
	for i := start; i < len(d.data); i++ {
		switch c := d.data[i]; {
		case c == '"':
			raw := d.data[start:i]
			if !utf8.Valid(raw) {
				return d.slowString(start) // replaces each bad byte, as encoding/json does
			}
			d.pos = i + 1
			return string(raw), nil
		case c == '\\':
			return d.slowString(start)
		case c < 0x20:
			d.pos = i
			return "", d.errorf("control character in a string")
		}
	}
	d.pos = len(d.data)
	return "", d.errorf("unterminated string")
}

// hasControl reports whether b holds a byte below 0x20, eight bytes at a
// time: a byte c < 0x20 makes (c - 0x20) borrow into its top bit while ^c
// keeps it, and bytes ≥ 0x80 are masked off by ^c.
func hasControl(b []byte) bool {
	const highs, limit = 0x8080808080808080, 0x20 * 0x0101010101010101
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		if (x-limit)&^x&highs != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

func (d *jsonDecoder) slowString(start int) (string, error) {
	var b strings.Builder
	if end := bytes.IndexByte(d.data[start:], '"'); end > 0 {
		b.Grow(end) // at least the text up to the first quote
	}
	i := start
	for i < len(d.data) {
		c := d.data[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return b.String(), nil
		case c < 0x20:
			d.pos = i
			return "", d.errorf("control character in a string")
		case c == '\\':
			if i+1 >= len(d.data) {
				d.pos = i
				return "", d.errorf("unterminated string")
			}
			i++
			switch e := d.data[i]; e {
			case '"', '\\', '/':
				b.WriteByte(e)
				i++
			case 'b':
				b.WriteByte('\b')
				i++
			case 'f':
				b.WriteByte('\f')
				i++
			case 'n':
				b.WriteByte('\n')
				i++
			case 'r':
				b.WriteByte('\r')
				i++
			case 't':
				b.WriteByte('\t')
				i++
			case 'u':
				r, ok := hex4(d.data[i+1:])
				if !ok {
					d.pos = i
					return "", d.errorf("bad \\u escape")
				}
				i += 5
				if utf16.IsSurrogate(r) {
					// A pair makes one rune; a lone half becomes U+FFFD, as
					// encoding/json does.
					r2, ok2 := rune(0), false
					if i+1 < len(d.data) && d.data[i] == '\\' && d.data[i+1] == 'u' {
						r2, ok2 = hex4(d.data[i+2:])
					}
					if dec := utf16.DecodeRune(r, r2); ok2 && dec != utf8.RuneError {
						r = dec
						i += 6
					} else {
						r = utf8.RuneError
					}
				}
				b.WriteRune(r)
			default:
				d.pos = i
				return "", d.errorf("bad escape \\%c", e)
			}
		default:
			// Copy the run up to the next quote, escape or control
			// character in one go.
			j := i
			for j < len(d.data) && d.data[j] != '"' && d.data[j] != '\\' && d.data[j] >= 0x20 {
				j++
			}
			if run := d.data[i:j]; utf8.Valid(run) {
				b.Write(run)
			} else {
				for len(run) > 0 {
					r, size := utf8.DecodeRune(run)
					b.WriteRune(r) // invalid bytes become U+FFFD
					run = run[size:]
				}
			}
			i = j
		}
	}
	d.pos = len(d.data)
	return "", d.errorf("unterminated string")
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// number reads a JSON number, strictly by the grammar.
func (d *jsonDecoder) number() (any, error) {
	start := d.pos
	i := d.pos
	digits := func() int {
		n := 0
		for i < len(d.data) && d.data[i] >= '0' && d.data[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if d.data[i] == '-' {
		i++
	}
	switch {
	case i < len(d.data) && d.data[i] == '0':
		i++
	case digits() == 0:
		d.pos = i
		return nil, d.errorf("bad number")
	}
	integer := true
	if i < len(d.data) && d.data[i] == '.' {
		i++
		integer = false
		if digits() == 0 {
			d.pos = i
			return nil, d.errorf("bad number")
		}
	}
	if i < len(d.data) && (d.data[i] == 'e' || d.data[i] == 'E') {
		i++
		integer = false
		if i < len(d.data) && (d.data[i] == '+' || d.data[i] == '-') {
			i++
		}
		if digits() == 0 {
			d.pos = i
			return nil, d.errorf("bad number")
		}
	}
	d.pos = i
	return decodeNumber(string(d.data[start:i]), integer)
}

// decodeNumber turns integer literals into int64 and everything else into
// float64, as Python does (ints beyond int64 become floats here; Python would
// keep them exact; huge exponents give ±Inf as Python's float() does).
func decodeNumber(s string, integer bool) (any, error) {
	if integer {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return f, nil
		}
		return nil, fmt.Errorf("json: bad number %q: %w", s, err)
	}
	return f, nil
}
