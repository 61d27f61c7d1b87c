package vllmwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxDepth bounds the nesting this package follows inside values it skips
// or keeps raw; deeper input is rejected rather than risking the stack.
const maxDepth = 64

// errTruncated reports input that ends inside a value.
var errTruncated = errors.New("msgpack input truncated")

// reader is a msgpack reader over one byte slice. It uses the msgpack
// library's low-level decoder for scalars and headers and tracks its own
// position so it can keep raw spans and skip values without recursion
// limits it does not control.
type reader struct {
	data []byte
	br   bytes.Reader
	d    *msgpack.Decoder
}

func newReader(data []byte) *reader {
	r := &reader{data: data}
	r.br.Reset(data)
	r.d = msgpack.NewDecoder(&r.br)
	return r
}

func (r *reader) pos() int       { return len(r.data) - r.br.Len() }
func (r *reader) remaining() int { return r.br.Len() }

func (r *reader) peek() (byte, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return 0, errTruncated
	}
	return c, nil
}

// isNil consumes a nil and reports true, or leaves a non-nil value in place.
func (r *reader) isNil() (bool, error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	if c != msgpcode.Nil {
		return false, nil
	}
	_ = r.d.DecodeNil()
	return true, nil
}

func isArrayCode(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMapCode(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isStringCode(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func isBinCode(c byte) bool {
	return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

func isUintCode(c byte) bool {
	return msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32 || c == msgpcode.Uint64
}

func isIntCode(c byte) bool {
	return c >= msgpcode.NegFixedNumLow ||
		c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64
}

// arrayLen reads an array header whose elements must each take at least
// one byte of the remaining input, so a forged length cannot allocate.
func (r *reader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if !isArrayCode(c) {
		return 0, fmt.Errorf("want array, got %s", codeName(c))
	}
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return 0, errTruncated
	}
	if n > r.remaining() {
		return 0, fmt.Errorf("array of %d elements in %d bytes: %w", n, r.remaining(), errTruncated)
	}
	return n, nil
}

// mapLen reads a map header, bounded like arrayLen.
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if !isMapCode(c) {
		return 0, fmt.Errorf("want map, got %s", codeName(c))
	}
	n, err := r.d.DecodeMapLen()
	if err != nil {
		return 0, errTruncated
	}
	if n > r.remaining()/2 {
		return 0, fmt.Errorf("map of %d entries in %d bytes: %w", n, r.remaining(), errTruncated)
	}
	return n, nil
}

func (r *reader) str() (string, error) {
	c, err := r.peek()
	if err != nil {
		return "", err
	}
	if !isStringCode(c) {
		return "", fmt.Errorf("want string, got %s", codeName(c))
	}
	if err := r.fits(); err != nil {
		return "", err
	}
	s, err := r.d.DecodeString()
	if err != nil {
		return "", errTruncated
	}
	return s, nil
}

func (r *reader) optStr() (*string, error) {
	if null, err := r.isNil(); err != nil || null {
		return nil, err
	}
	s, err := r.str()
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// int64 reads any msgpack integer that fits an int64.
func (r *reader) int64() (int64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case isUintCode(c):
		u, err := r.d.DecodeUint64()
		if err != nil {
			return 0, errTruncated
		}
		if u > math.MaxInt64 {
			return 0, fmt.Errorf("integer %d overflows int64", u)
		}
		return int64(u), nil
	case isIntCode(c):
		v, err := r.d.DecodeInt64()
		if err != nil {
			return 0, errTruncated
		}
		return v, nil
	}
	return 0, fmt.Errorf("want integer, got %s", codeName(c))
}

func (r *reader) optInt64() (*int64, error) {
	if null, err := r.isNil(); err != nil || null {
		return nil, err
	}
	v, err := r.int64()
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// float reads a float64, float32 or integer (msgspec's float fields accept
// integers too).
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Double || c == msgpcode.Float:
		f, err := r.d.DecodeFloat64()
		if err != nil {
			return 0, errTruncated
		}
		return f, nil
	case isUintCode(c) || isIntCode(c):
		v, err := r.int64()
		return float64(v), err
	}
	return 0, fmt.Errorf("want float, got %s", codeName(c))
}

// engineHash reads an int (signed or unsigned) or a byte string.
func (r *reader) engineHash() (EngineHash, error) {
	c, err := r.peek()
	if err != nil {
		return EngineHash{}, err
	}
	switch {
	case isUintCode(c):
		u, err := r.d.DecodeUint64()
		if err != nil {
			return EngineHash{}, errTruncated
		}
		return HashUint(u), nil
	case isIntCode(c):
		v, err := r.d.DecodeInt64()
		if err != nil {
			return EngineHash{}, errTruncated
		}
		return HashInt(v), nil
	case isBinCode(c):
		if err := r.fits(); err != nil {
			return EngineHash{}, err
		}
		b, err := r.d.DecodeBytes()
		if err != nil {
			return EngineHash{}, errTruncated
		}
		return HashBytes(b), nil
	}
	return EngineHash{}, fmt.Errorf("block hash: want int or bytes, got %s", codeName(c))
}

func (r *reader) optEngineHash() (*EngineHash, error) {
	if null, err := r.isNil(); err != nil || null {
		return nil, err
	}
	h, err := r.engineHash()
	if err != nil {
		return nil, err
	}
	return &h, nil
}

func (r *reader) engineHashes() ([]EngineHash, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, fmt.Errorf("block_hashes: %w", err)
	}
	out := make([]EngineHash, n)
	for i := range out {
		// Integers, by far the common case, are read straight from the
		// bytes; anything else goes through the library decoder.
		if v, signed, next, ok := intAt(r.data, r.pos()); ok {
			if signed && int64(v) < 0 {
				out[i] = EngineHash{kind: hashInt, v: v}
			} else {
				out[i] = EngineHash{kind: hashUint, v: v}
			}
			if err := r.seek(next); err != nil {
				return nil, err
			}
			continue
		}
		if out[i], err = r.engineHash(); err != nil {
			return nil, fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
	}
	return out, nil
}

func (r *reader) tokens() ([]uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, fmt.Errorf("token_ids: %w", err)
	}
	out := make([]uint32, n)
	p := r.pos()
	data := r.data
	for i := range out {
		// Token ids come as unsigned integers of at most 32 bits: read
		// those here, anything else (and the input's last bytes) in intAt.
		if p+4 < len(data) {
			switch c := data[p]; {
			case c <= msgpcode.PosFixedNumHigh:
				out[i] = uint32(c)
				p++
				continue
			case c == msgpcode.Uint8:
				out[i] = uint32(data[p+1])
				p += 2
				continue
			case c == msgpcode.Uint16:
				out[i] = uint32(data[p+1])<<8 | uint32(data[p+2])
				p += 3
				continue
			case c == msgpcode.Uint32:
				out[i] = binary.BigEndian.Uint32(data[p+1 : p+5])
				p += 5
				continue
			}
		}
		v, signed, next, ok := intAt(data, p)
		switch {
		case !ok:
			if p >= len(r.data) {
				return nil, errTruncated
			}
			return nil, fmt.Errorf("token_ids[%d]: want non-negative integer, got %s", i, codeName(r.data[p]))
		case signed && int64(v) < 0:
			return nil, fmt.Errorf("token_ids[%d]: negative", i)
		case v > math.MaxUint32:
			return nil, fmt.Errorf("token_ids[%d]: %d overflows uint32", i, v)
		}
		out[i] = uint32(v)
		p = next
	}
	return out, r.seek(p)
}

func (r *reader) seek(p int) error {
	if _, err := r.br.Seek(int64(p), io.SeekStart); err != nil {
		return fmt.Errorf("seek: %w", err)
	}
	return nil
}

// fits checks that the next value's length headers fit the input, so the
// library never sizes a buffer from a forged length.
func (r *reader) fits() error {
	_, err := skipValue(r.data, r.pos(), maxDepth)
	return err
}

// raw returns the bytes of the next value (copied) and moves past it.
func (r *reader) raw() (msgpack.RawMessage, error) {
	start := r.pos()
	end, err := skipValue(r.data, start, 0)
	if err != nil {
		return nil, err
	}
	if _, err := r.br.Seek(int64(end), io.SeekStart); err != nil {
		return nil, fmt.Errorf("seek: %w", err)
	}
	return append(msgpack.RawMessage(nil), r.data[start:end]...), nil
}

// skip moves past the next value.
func (r *reader) skip() error {
	end, err := skipValue(r.data, r.pos(), 0)
	if err != nil {
		return err
	}
	_, err = r.br.Seek(int64(end), io.SeekStart)
	return err
}

func codeName(c byte) string {
	switch {
	case isArrayCode(c):
		return "array"
	case isMapCode(c):
		return "map"
	case isStringCode(c):
		return "string"
	case isBinCode(c):
		return "bytes"
	case isUintCode(c) || isIntCode(c):
		return "integer"
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case c == msgpcode.True || c == msgpcode.False:
		return "bool"
	}
	return fmt.Sprintf("code 0x%02x", c)
}
