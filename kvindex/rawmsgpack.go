// Byte-level msgpack reading: what the decoder does without the library,
// for speed (integer lists) or for control (bounded skipping).

package kvindex

import (
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// skipValue returns the offset just past the msgpack value at data[p:].
// Containers are followed to maxDepth levels.
func skipValue(data []byte, p, depth int) (int, error) {
	if depth > maxDepth {
		return 0, fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	if p >= len(data) {
		return 0, errTruncated
	}
	c := data[p]
	p++
	var n, elems int // n: payload bytes; elems: nested values
	switch {
	case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow:
	case msgpcode.IsFixedMap(c):
		elems = 2 * int(c&msgpcode.FixedMapMask)
	case msgpcode.IsFixedArray(c):
		elems = int(c & msgpcode.FixedArrayMask)
	case msgpcode.IsFixedString(c):
		n = int(c & msgpcode.FixedStrMask)
	case c == msgpcode.Nil || c == msgpcode.False || c == msgpcode.True:
	case c == msgpcode.Uint8 || c == msgpcode.Int8:
		n = 1
	case c == msgpcode.Uint16 || c == msgpcode.Int16:
		n = 2
	case c == msgpcode.Uint32 || c == msgpcode.Int32 || c == msgpcode.Float:
		n = 4
	case c == msgpcode.Uint64 || c == msgpcode.Int64 || c == msgpcode.Double:
		n = 8
	case c == msgpcode.FixExt1:
		n = 2
	case c == msgpcode.FixExt2:
		n = 3
	case c == msgpcode.FixExt4:
		n = 5
	case c == msgpcode.FixExt8:
		n = 9
	case c == msgpcode.FixExt16:
		n = 17
	case c == msgpcode.Str8 || c == msgpcode.Bin8 || c == msgpcode.Ext8:
		l, q, err := readLen(data, p, 1)
		if err != nil {
			return 0, err
		}
		p, n = q, l
		if c == msgpcode.Ext8 {
			n++
		}
	case c == msgpcode.Str16 || c == msgpcode.Bin16 || c == msgpcode.Ext16:
		l, q, err := readLen(data, p, 2)
		if err != nil {
			return 0, err
		}
		p, n = q, l
		if c == msgpcode.Ext16 {
			n++
		}
	case c == msgpcode.Str32 || c == msgpcode.Bin32 || c == msgpcode.Ext32:
		l, q, err := readLen(data, p, 4)
		if err != nil {
			return 0, err
		}
		p, n = q, l
		if c == msgpcode.Ext32 {
			n++
		}
	case c == msgpcode.Array16 || c == msgpcode.Map16:
		l, q, err := readLen(data, p, 2)
		if err != nil {
			return 0, err
		}
		p, elems = q, l
		if c == msgpcode.Map16 {
			elems *= 2
		}
	case c == msgpcode.Array32 || c == msgpcode.Map32:
		l, q, err := readLen(data, p, 4)
		if err != nil {
			return 0, err
		}
		p, elems = q, l
		if c == msgpcode.Map32 {
			elems *= 2
		}
	default:
		return 0, fmt.Errorf("invalid msgpack code 0x%02x", c)
	}
	if n > len(data)-p {
		return 0, errTruncated
	}
	p += n
	if elems > len(data)-p {
		return 0, errTruncated
	}
	for i := 0; i < elems; i++ {
		var err error
		if p, err = skipValue(data, p, depth+1); err != nil {
			return 0, err
		}
	}
	return p, nil
}

func readLen(data []byte, p, size int) (int, int, error) {
	if len(data)-p < size {
		return 0, 0, errTruncated
	}
	var l uint64
	for i := 0; i < size; i++ {
		l = l<<8 | uint64(data[p+i])
	}
	if l > uint64(len(data)) {
		return 0, 0, errTruncated
	}
	return int(l), p + size, nil
}

// intAt reads the msgpack integer at data[p]: its value (two's complement
// for the signed forms), whether it used a signed form, and the offset
// after it. ok is false for anything else or for a truncated integer.
func intAt(data []byte, p int) (v uint64, signed bool, next int, ok bool) {
	if p >= len(data) {
		return 0, false, 0, false
	}
	c := data[p]
	var size int
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), false, p + 1, true
	case c >= msgpcode.NegFixedNumLow:
		return uint64(int64(int8(c))), true, p + 1, true
	case c == msgpcode.Uint8 || c == msgpcode.Int8:
		size = 1
	case c == msgpcode.Uint16 || c == msgpcode.Int16:
		size = 2
	case c == msgpcode.Uint32 || c == msgpcode.Int32:
		size = 4
	case c == msgpcode.Uint64 || c == msgpcode.Int64:
		size = 8
	default:
		return 0, false, 0, false
	}
	if len(data)-p-1 < size {
		return 0, false, 0, false
	}
	b := data[p+1 : p+1+size]
	signed = c >= msgpcode.Int8 && c <= msgpcode.Int64
	switch size {
	case 1:
		v = uint64(b[0])
		if signed {
			v = uint64(int64(int8(b[0])))
		}
	case 2:
		v = uint64(binary.BigEndian.Uint16(b))
		if signed {
			v = uint64(int64(int16(v)))
		}
	case 4:
		v = uint64(binary.BigEndian.Uint32(b))
		if signed {
			v = uint64(int64(int32(v)))
		}
	case 8:
		v = binary.BigEndian.Uint64(b)
	}
	return v, signed, p + 1 + size, true
}
