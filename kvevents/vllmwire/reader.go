package vllmwire

// Reader reads msgpack values the codec keeps raw, such as a BlockStored's
// ExtraKeys, with the same limits as the decoder: a forged length is an
// error, never an allocation, and nesting deeper than the decoder follows is
// rejected. It is what the index uses to read extra keys without a msgpack
// reader of its own.
type Reader struct {
	r *reader
}

// NewReader returns a Reader over data, which it does not copy.
func NewReader(data []byte) Reader { return Reader{r: newReader(data)} }

// Peek returns the msgpack type code of the next value without consuming it.
func (r Reader) Peek() (byte, error) { return r.r.peek() }

// IsNil consumes a nil and reports true, or leaves a non-nil value in place.
func (r Reader) IsNil() (bool, error) { return r.r.isNil() }

// ArrayLen reads an array header.
func (r Reader) ArrayLen() (int, error) { return r.r.arrayLen() }

// Str reads a string.
func (r Reader) Str() (string, error) { return r.r.str() }

// Int64 reads any integer that fits an int64.
func (r Reader) Int64() (int64, error) { return r.r.int64() }

// Skip moves past the next value.
func (r Reader) Skip() error { return r.r.skip() }

// Remaining returns the number of unread bytes.
func (r Reader) Remaining() int { return r.r.remaining() }

// IsStringCode reports whether c, from Peek, starts a string.
func IsStringCode(c byte) bool { return isStringCode(c) }

// IsArrayCode reports whether c, from Peek, starts an array.
func IsArrayCode(c byte) bool { return isArrayCode(c) }
