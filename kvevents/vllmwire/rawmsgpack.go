// Byte-level msgpack reading: what the decoder does without the library,
// for speed (integer lists) or for control (bounded skipping).

package vllmwire

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
	p, n, elems, err := valueHeader(data, p)
	if err != nil {
		return 0, err
	}
	if n > len(data)-p {
		return 0, errTruncated
	}
	p += n
	if elems > len(data)-p {
		return 0, errTruncated
	}
	for i := 0; i < elems; i++ {
		if p, err = skipValue(data, p, depth+1); err != nil {
			return 0, err
		}
	}
	return p, nil
}

// valueHeader reads the code of the value at data[p] (p < len(data)) and
// any length that follows it. It returns the offset past them, the payload
// bytes that come next (n) and the number of nested values (elems).
func valueHeader(data []byte, p int) (next, n, elems int, err error) {
	c := data[p]
	p++
	if n, ok := fixedPayload(c); ok {
		return p, n, 0, nil
	}
	if elems, ok := fixedContainer(c); ok {
		return p, 0, elems, nil
	}
	if size, extra, ok := blobLength(c); ok {
		l, q, err := readLen(data, p, size)
		if err != nil {
			return 0, 0, 0, err
		}
		return q, l + extra, 0, nil
	}
	if size, per, ok := containerLength(c); ok {
		l, q, err := readLen(data, p, size)
		if err != nil {
			return 0, 0, 0, err
		}
		return q, 0, l * per, nil
	}
	return 0, 0, 0, fmt.Errorf("invalid msgpack code 0x%02x", c)
}

// fixedPayload reports the payload size of the values whose code alone
// fixes it: fixints, nil and booleans, sized numbers, fixstr and fixext.
func fixedPayload(c byte) (n int, ok bool) {
	switch {
	case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow:
		return 0, true
	case msgpcode.IsFixedString(c):
		return int(c & msgpcode.FixedStrMask), true
	}
	switch c {
	case msgpcode.Nil, msgpcode.False, msgpcode.True:
		return 0, true
	case msgpcode.Uint8, msgpcode.Int8:
		return 1, true
	case msgpcode.Uint16, msgpcode.Int16:
		return 2, true
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		return 4, true
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		return 8, true
	case msgpcode.FixExt1:
		return 2, true // type byte + data
	case msgpcode.FixExt2:
		return 3, true
	case msgpcode.FixExt4:
		return 5, true
	case msgpcode.FixExt8:
		return 9, true
	case msgpcode.FixExt16:
		return 17, true
	}
	return 0, false
}

// fixedContainer reports the nested values of a fixmap or fixarray.
func fixedContainer(c byte) (elems int, ok bool) {
	switch {
	case msgpcode.IsFixedMap(c):
		return 2 * int(c&msgpcode.FixedMapMask), true
	case msgpcode.IsFixedArray(c):
		return int(c & msgpcode.FixedArrayMask), true
	}
	return 0, false
}

// blobLength reports, for str, bin and ext codes with a length field, the
// size of that field and the bytes the payload holds beyond the length (the
// ext type byte).
func blobLength(c byte) (size, extra int, ok bool) {
	switch c {
	case msgpcode.Str8, msgpcode.Bin8:
		return 1, 0, true
	case msgpcode.Str16, msgpcode.Bin16:
		return 2, 0, true
	case msgpcode.Str32, msgpcode.Bin32:
		return 4, 0, true
	case msgpcode.Ext8:
		return 1, 1, true
	case msgpcode.Ext16:
		return 2, 1, true
	case msgpcode.Ext32:
		return 4, 1, true
	}
	return 0, 0, false
}

// containerLength reports, for array and map codes with a length field, the
// size of that field and the nested values per counted element (2 for maps).
func containerLength(c byte) (size, per int, ok bool) {
	switch c {
	case msgpcode.Array16:
		return 2, 1, true
	case msgpcode.Map16:
		return 2, 2, true
	case msgpcode.Array32:
		return 4, 1, true
	case msgpcode.Map32:
		return 4, 2, true
	}
	return 0, 0, false
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
