package vllmwire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// EncodeBatch encodes b exactly as vLLM's msgspec encoder lays out a
// KVEventBatch in b.Format: integers in their smallest msgpack form
// (non-negative ones unsigned), strings as fixstr/str8/16/32, floats as
// float64, and in the map forms the fields holding their None default
// omitted (msgspec omit_defaults). A batch from DecodeBatch re-encodes to
// the bytes it came from when a vLLM encoder produced them.
func EncodeBatch(b EventBatch) ([]byte, error) {
	return AppendBatch(nil, b)
}

// AppendBatch is EncodeBatch appending to dst.
func AppendBatch(dst []byte, b EventBatch) ([]byte, error) {
	mapEvents := b.Format == FormatEventMaps || b.Format == FormatMap
	switch b.Format {
	case FormatArray, FormatEventMaps:
		n := b.WireFields
		if n == 0 {
			n = 3
		}
		if n < 2 || n > 3 {
			return nil, fmt.Errorf("encode batch: WireFields %d, want 2 or 3", n)
		}
		dst = appendArrayHeader(dst, n+len(b.Unknown))
		dst = appendFloat(dst, b.TS)
		var err error
		if dst, err = appendEvents(dst, b.Events, mapEvents); err != nil {
			return nil, err
		}
		if n == 3 {
			dst = appendOptInt(dst, intPtr64(b.DPRank))
		}
		dst = appendUnknown(dst, b.Unknown, false)
	case FormatMap:
		n := 2 + len(b.Unknown)
		if b.DPRank != nil {
			n++
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "ts")
		dst = appendFloat(dst, b.TS)
		dst = appendStr(dst, "events")
		var err error
		if dst, err = appendEvents(dst, b.Events, true); err != nil {
			return nil, err
		}
		if b.DPRank != nil {
			dst = appendStr(dst, "data_parallel_rank")
			dst = appendInt(dst, int64(*b.DPRank))
		}
		dst = appendUnknown(dst, b.Unknown, true)
	default:
		return nil, fmt.Errorf("encode batch: unknown format %v", b.Format)
	}
	return dst, nil
}

func intPtr64(p *int) *int64 {
	if p == nil {
		return nil
	}
	v := int64(*p)
	return &v
}

func appendEvents(dst []byte, events []Event, asMap bool) ([]byte, error) {
	dst = appendArrayHeader(dst, len(events))
	for i, ev := range events {
		switch e := ev.(type) {
		case BlockStored:
			dst = appendStored(dst, &e, asMap)
		case *BlockStored:
			dst = appendStored(dst, e, asMap)
		case BlockRemoved:
			dst = appendRemoved(dst, &e, asMap)
		case *BlockRemoved:
			dst = appendRemoved(dst, e, asMap)
		case AllBlocksCleared:
			dst = appendCleared(dst, &e, asMap)
		case *AllBlocksCleared:
			dst = appendCleared(dst, e, asMap)
		default:
			return nil, fmt.Errorf("encode batch: event %d has unknown type %T", i, ev)
		}
	}
	return dst, nil
}

func appendStored(dst []byte, e *BlockStored, asMap bool) []byte {
	if asMap {
		n := 8 + len(e.Unknown)
		for _, present := range []bool{e.ExtraKeys != nil, e.GroupIdx != nil, e.KVCacheSpecKind != nil, e.KVCacheSpecSlidingWindow != nil} {
			if present {
				n++
			}
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, e.Tag())
		for i := 0; i < storedFields; i++ {
			if i >= 7 && !e.has(i) {
				continue // omit_defaults: None defaults are not written
			}
			dst = appendStr(dst, storedFieldNames[i])
			dst = e.appendField(dst, i)
		}
		return appendUnknown(dst, e.Unknown, true)
	}
	w := e.WireFields
	if w == 0 {
		w = storedFields
	}
	dst = appendArrayHeader(dst, 1+w+len(e.Unknown))
	dst = appendStr(dst, e.Tag())
	for i := 0; i < w; i++ {
		dst = e.appendField(dst, i)
	}
	return appendUnknown(dst, e.Unknown, false)
}

func (e *BlockStored) has(i int) bool {
	switch i {
	case 7:
		return e.ExtraKeys != nil
	case 8:
		return e.GroupIdx != nil
	case 9:
		return e.KVCacheSpecKind != nil
	case 10:
		return e.KVCacheSpecSlidingWindow != nil
	}
	return true
}

func (e *BlockStored) appendField(dst []byte, i int) []byte {
	switch i {
	case 0:
		return appendHashes(dst, e.BlockHashes)
	case 1:
		if e.ParentBlockHash == nil {
			return append(dst, 0xc0)
		}
		return appendHash(dst, *e.ParentBlockHash)
	case 2:
		dst = appendArrayHeader(dst, len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			dst = appendUint(dst, uint64(t))
		}
		return dst
	case 3:
		return appendInt(dst, int64(e.BlockSize))
	case 4:
		return appendOptInt(dst, e.LoraID)
	case 5:
		return appendOptStr(dst, e.Medium)
	case 6:
		return appendOptStr(dst, e.LoraName)
	case 7:
		if e.ExtraKeys == nil {
			return append(dst, 0xc0)
		}
		return append(dst, e.ExtraKeys...)
	case 8:
		return appendOptInt(dst, e.GroupIdx)
	case 9:
		return appendOptStr(dst, e.KVCacheSpecKind)
	case 10:
		return appendOptInt(dst, e.KVCacheSpecSlidingWindow)
	}
	return append(dst, 0xc0) // a field past the known schema with no value
}

func appendRemoved(dst []byte, e *BlockRemoved, asMap bool) []byte {
	if asMap {
		n := 3 + len(e.Unknown)
		if e.GroupIdx != nil {
			n++
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, e.Tag())
		dst = appendStr(dst, "block_hashes")
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendStr(dst, "medium")
		dst = appendOptStr(dst, e.Medium)
		if e.GroupIdx != nil {
			dst = appendStr(dst, "group_idx")
			dst = appendInt(dst, *e.GroupIdx)
		}
		return appendUnknown(dst, e.Unknown, true)
	}
	w := e.WireFields
	if w == 0 {
		w = removedFields
	}
	dst = appendArrayHeader(dst, 1+w+len(e.Unknown))
	dst = appendStr(dst, e.Tag())
	for i := 0; i < w; i++ {
		switch i {
		case 0:
			dst = appendHashes(dst, e.BlockHashes)
		case 1:
			dst = appendOptStr(dst, e.Medium)
		case 2:
			dst = appendOptInt(dst, e.GroupIdx)
		default:
			dst = append(dst, 0xc0)
		}
	}
	return appendUnknown(dst, e.Unknown, false)
}

func appendCleared(dst []byte, e *AllBlocksCleared, asMap bool) []byte {
	if asMap {
		dst = appendMapHeader(dst, 1+len(e.Unknown))
		dst = appendStr(dst, "type")
		dst = appendStr(dst, e.Tag())
		return appendUnknown(dst, e.Unknown, true)
	}
	dst = appendArrayHeader(dst, 1+len(e.Unknown))
	dst = appendStr(dst, e.Tag())
	return appendUnknown(dst, e.Unknown, false)
}

// appendUnknown writes kept fields: named ones as map entries, positional
// ones as array elements. A field of the other kind is dropped, since the
// layout has no place for it.
func appendUnknown(dst []byte, fields []UnknownField, asMap bool) []byte {
	for _, f := range fields {
		if asMap {
			dst = appendStr(dst, f.Name)
		}
		if len(f.Value) == 0 {
			dst = append(dst, 0xc0)
			continue
		}
		dst = append(dst, f.Value...)
	}
	return dst
}

func appendHashes(dst []byte, hs []EngineHash) []byte {
	dst = appendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = appendHash(dst, h)
	}
	return dst
}

func appendHash(dst []byte, h EngineHash) []byte {
	switch h.kind {
	case hashBytes:
		return appendBin(dst, h.b)
	case hashInt:
		return appendInt(dst, int64(h.v))
	}
	return appendUint(dst, h.v)
}

func appendArrayHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}

func appendStr(dst []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n < 1<<8:
		dst = append(dst, 0xd9, byte(n))
	case n < 1<<16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

func appendBin(dst []byte, s string) []byte {
	switch n := len(s); {
	case n < 1<<8:
		dst = append(dst, 0xc4, byte(n))
	case n < 1<<16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xc5), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	return append(dst, s...)
}

func appendOptStr(dst []byte, s *string) []byte {
	if s == nil {
		return append(dst, 0xc0)
	}
	return appendStr(dst, *s)
}

func appendOptInt(dst []byte, v *int64) []byte {
	if v == nil {
		return append(dst, 0xc0)
	}
	return appendInt(dst, *v)
}

// appendUint writes v the way msgspec writes a non-negative Python int.
func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v < 1<<7:
		return append(dst, byte(v))
	case v < 1<<8:
		return append(dst, 0xcc, byte(v))
	case v < 1<<16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(v))
	case v < 1<<32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

// appendInt writes v the way msgspec writes a Python int.
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -(1 << 5):
		return append(dst, byte(v))
	case v >= -(1 << 7):
		return append(dst, 0xd0, byte(v))
	case v >= -(1 << 15):
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= -(1 << 31):
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

func appendFloat(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}
