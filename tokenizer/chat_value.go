package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Object is a JSON object that keeps its keys in the order they arrived, as
// the dict that Python's json.loads builds does. Chat templates that print
// request objects with tojson must see that order, so request values are held
// as Objects rather than Go maps.
//
// The values inside an Object (and inside the []any lists it may hold) are
// those of a decoded JSON document: nil, bool, int64 (integer literals that
// fit), float64, string, []any and Object.
type Object []Field

// Field is one key and its value in an Object.
type Field struct {
	Key   string
	Value any
}

// Get returns the value stored under key and whether the key is present.
func (o Object) Get(key string) (any, bool) {
	for _, f := range o {
		if f.Key == key {
			return f.Value, true
		}
	}
	return nil, false
}

// Set replaces the value under key in place, keeping its position, or appends
// the key when it is new (a Python dict assignment does the same).
func (o *Object) Set(key string, value any) {
	for i := range *o {
		if (*o)[i].Key == key {
			(*o)[i].Value = value
			return
		}
	}
	*o = append(*o, Field{Key: key, Value: value})
}

// Delete removes key if present.
func (o *Object) Delete(key string) {
	for i := range *o {
		if (*o)[i].Key == key {
			*o = append((*o)[:i], (*o)[i+1:]...)
			return
		}
	}
}

// maxJSONDepth bounds nesting so that hostile bodies cannot exhaust the stack.
const maxJSONDepth = 512

// DecodeJSON decodes one JSON document into the values described on Object,
// keeping object key order. Trailing data after the document is an error.
func DecodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("json: unexpected data after the top-level value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("json: %w", err)
	}
	return decodeFrom(dec, tok, depth)
}

func decodeFrom(dec *json.Decoder, tok json.Token, depth int) (any, error) {
	switch t := tok.(type) {
	case nil, bool, string:
		return t, nil
	case json.Number:
		return decodeNumber(t)
	case json.Delim:
		if depth >= maxJSONDepth {
			return nil, fmt.Errorf("json: nesting deeper than %d levels", maxJSONDepth)
		}
		switch t {
		case '{':
			obj := Object{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("json: %w", err)
				}
				key, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("json: object key is %T, not a string", kt)
				}
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				// Python's json.loads keeps the last duplicate at the position of the first.
				obj.Set(key, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("json: %w", err)
			}
			return obj, nil
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("json: %w", err)
			}
			return list, nil
		}
	}
	return nil, fmt.Errorf("json: unexpected token %v", tok)
}

// decodeNumber turns integer literals into int64 and everything else into
// float64, as Python does (ints beyond int64 become floats here; Python would
// keep them exact).
func decodeNumber(n json.Number) (any, error) {
	s := string(n)
	if !bytes.ContainsAny([]byte(s), ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return f, nil // ±Inf, as Python's float() gives for huge literals
		}
		return nil, fmt.Errorf("json: bad number %q: %w", s, err)
	}
	return f, nil
}
