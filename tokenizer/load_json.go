package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonScanner is a small JSON reader for the two big members of
// tokenizer.json, the vocabulary and the merges (hundreds of thousands of
// entries), which encoding/json decodes several times slower. Everything
// else is cut out as raw bytes and left to encoding/json.
type jsonScanner struct {
	data []byte
	pos  int
}

func (s *jsonScanner) errorf(format string, args ...any) error {
	return fmt.Errorf("json offset %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *jsonScanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (s *jsonScanner) peek() byte {
	s.skipSpace()
	if s.pos >= len(s.data) {
		return 0
	}
	return s.data[s.pos]
}

func (s *jsonScanner) expect(c byte) error {
	if s.peek() != c {
		return s.errorf("expected %q", c)
	}
	s.pos++
	return nil
}

// str reads a JSON string.
func (s *jsonScanner) str() (string, error) {
	b, err := s.strBytes()
	return string(b), err
}

// strBytes reads a JSON string; without escapes the result aliases the input.
func (s *jsonScanner) strBytes() ([]byte, error) {
	if s.peek() != '"' {
		return nil, s.errorf("expected a string")
	}
	s.pos++
	start := s.pos
	// Find the closing quote with IndexByte (assembly, fast even under the
	// race detector); escapes send the rest to strSlow.
	end := bytes.IndexByte(s.data[start:], '"')
	if end < 0 {
		return nil, s.errorf("unterminated string")
	}
	v := s.data[start : start+end]
	if bytes.IndexByte(v, '\\') >= 0 {
		return s.strSlow(start)
	}
	s.pos = start + end + 1
	for _, c := range v {
		if c < 0x20 {
			return nil, s.errorf("control character in string")
		}
	}
	if !utf8.Valid(v) {
		return []byte(string([]rune(string(v)))), nil
	}
	return v, nil
}

// strSlow finishes a string that has escapes, from its first byte at start.
func (s *jsonScanner) strSlow(start int) ([]byte, error) {
	buf := append([]byte(nil), s.data[start:s.pos]...)
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			if !utf8.Valid(buf) {
				return []byte(string([]rune(string(buf)))), nil
			}
			return buf, nil
		case c < 0x20:
			return nil, s.errorf("control character in string")
		case c != '\\':
			buf = append(buf, c)
			s.pos++
			continue
		}
		if s.pos+1 >= len(s.data) {
			break
		}
		e := s.data[s.pos+1]
		s.pos += 2
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, err := s.hex4()
			if err != nil {
				return nil, err
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if s.pos+1 < len(s.data) && s.data[s.pos] == '\\' && s.data[s.pos+1] == 'u' {
					save := s.pos
					s.pos += 2
					if r2, err = s.hex4(); err != nil {
						return nil, err
					}
					if utf16.DecodeRune(r, r2) == utf8.RuneError {
						s.pos = save
						r2 = -1
					}
				}
				if r2 >= 0 {
					r = utf16.DecodeRune(r, r2)
				} else {
					r = utf8.RuneError
				}
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return nil, s.errorf("bad escape \\%c", e)
		}
	}
	return nil, s.errorf("unterminated string")
}

func (s *jsonScanner) hex4() (rune, error) {
	if s.pos+4 > len(s.data) {
		return 0, s.errorf("short \\u escape")
	}
	v, err := strconv.ParseUint(string(s.data[s.pos:s.pos+4]), 16, 16)
	if err != nil {
		return 0, s.errorf("bad \\u escape")
	}
	s.pos += 4
	return rune(v), nil
}

// uint reads a non-negative integer that fits in 32 bits.
func (s *jsonScanner) uint() (uint32, error) {
	s.skipSpace()
	start := s.pos
	var v uint64
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		v = v*10 + uint64(s.data[s.pos]-'0')
		if v > 1<<32-1 {
			return 0, s.errorf("number too large for a token id")
		}
		s.pos++
	}
	if s.pos == start {
		return 0, s.errorf("expected a token id")
	}
	return uint32(v), nil
}

// skip passes over one JSON value of any kind and returns its raw bytes.
func (s *jsonScanner) skip() ([]byte, error) {
	c := s.peek()
	start := s.pos
	var err error
	switch c {
	case '"':
		_, err = s.strBytes()
	case '{':
		err = s.object(func(string) error { _, err := s.skip(); return err })
	case '[':
		err = s.array(func() error { _, err := s.skip(); return err })
	default:
		for s.pos < len(s.data) {
			d := s.data[s.pos]
			if d == ',' || d == '}' || d == ']' || d == ' ' || d == '\t' || d == '\n' || d == '\r' {
				break
			}
			s.pos++
		}
		if s.pos == start {
			err = s.errorf("expected a value")
		}
	}
	return s.data[start:s.pos], err
}

// object calls member for each key of an object; member must consume the value.
func (s *jsonScanner) object(member func(key string) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.pos++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := member(key); err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return nil
		default:
			return s.errorf("expected ',' or '}'")
		}
	}
}

// array calls elem for each element; elem must consume the element.
func (s *jsonScanner) array(elem func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.peek() == ']' {
		s.pos++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return s.errorf("expected ',' or ']'")
		}
	}
}

// vocab reads the model's {"token": id, ...} object. All keys share one
// backing string, which saves an allocation per token.
func (s *jsonScanner) vocab() (map[string]uint32, error) {
	type entry struct{ off, n, id uint32 }
	var arena []byte
	var entries []entry
	if err := s.expect('{'); err != nil {
		return nil, err
	}
	if s.peek() != '}' {
		for {
			key, err := s.strBytes()
			if err != nil {
				return nil, err
			}
			if err := s.expect(':'); err != nil {
				return nil, err
			}
			id, err := s.uint()
			if err != nil {
				return nil, err
			}
			entries = append(entries, entry{uint32(len(arena)), uint32(len(key)), id})
			arena = append(arena, key...)
			if c := s.peek(); c == ',' {
				s.pos++
				continue
			} else if c != '}' {
				return nil, s.errorf("expected ',' or '}'")
			}
			break
		}
	}
	s.pos++
	keys := string(arena)
	v := make(map[string]uint32, len(entries))
	for _, e := range entries {
		v[keys[e.off:e.off+e.n]] = e.id
	}
	return v, nil
}

// merges reads the model's merges in either form, "a b" or ["a", "b"]. The
// tokens alias the input where they have no escapes.
func (s *jsonScanner) merges() ([]mergeJSON, error) {
	var out []mergeJSON
	err := s.array(func() error {
		if s.peek() == '"' {
			line, err := s.strBytes()
			if err != nil {
				return err
			}
			a, b, ok := cutSpace(line)
			if !ok {
				return fmt.Errorf("merge %q is not two tokens separated by a space", line)
			}
			out = append(out, mergeJSON{a, b})
			return nil
		}
		var pair [2][]byte
		n := 0
		err := s.array(func() error {
			t, err := s.strBytes()
			if n < 2 {
				pair[n] = t
			}
			n++
			return err
		})
		if err != nil {
			return err
		}
		if n != 2 {
			return errors.New("merge pair does not have two tokens")
		}
		out = append(out, mergeJSON{pair[0], pair[1]})
		return nil
	})
	return out, err
}

func cutSpace(s []byte) ([]byte, []byte, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return nil, nil, false
}
