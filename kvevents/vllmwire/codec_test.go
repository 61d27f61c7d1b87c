package vllmwire

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func ptr[T any](v T) *T { return &v }

func mustRaw(t testing.TB, v any) msgpack.RawMessage {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	tokA = []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667}
	tokB = []uint32{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 1015}
)

const goldenTS = 1789095808.8378847

func cat(a, b []uint32) []uint32 { return append(append([]uint32{}, a...), b...) }

func sha(s string) EngineHash {
	h := sha256.Sum256([]byte(s))
	return HashBytes(h[:])
}

// goldenBatches are the values the frames in testdata hold, built by
// hand from vLLM's class definitions.
func goldenBatches(t testing.TB) map[string]EventBatch {
	big := HashUint(15760518052499183552)
	return map[string]EventBatch{
		"array_v023.msgpack": {TS: goldenTS, DPRank: ptr(0), Format: FormatArray, Events: []Event{
			BlockStored{
				BlockHashes: []EngineHash{big, HashUint(42)}, TokenIDs: cat(tokA, tokB), BlockSize: 16,
				Medium: ptr("GPU"), ExtraKeys: []byte("\x92\x91\xa8tenant-a\xc0"),
				GroupIdx: ptr[int64](0), KVCacheSpecKind: ptr("full_attention"),
			},
			BlockRemoved{BlockHashes: []EngineHash{HashUint(42)}, Medium: ptr("GPU"), GroupIdx: ptr[int64](0)},
			AllBlocksCleared{},
		}},
		"array_v09.msgpack": {TS: 1.5, Format: FormatArray, WireFields: 2, Events: []Event{
			BlockStored{
				BlockHashes: []EngineHash{HashInt(-4611686018427387904), HashUint(7)},
				TokenIDs:    cat(tokA, tokB), BlockSize: 16, WireFields: 5,
			},
			BlockRemoved{BlockHashes: []EngineHash{HashUint(7)}, WireFields: 1},
		}},
		"eventmaps.msgpack": {TS: goldenTS, DPRank: ptr(0), Format: FormatEventMaps, Events: []Event{
			BlockStored{
				BlockHashes: []EngineHash{big}, TokenIDs: tokA, BlockSize: 16, Medium: ptr("GPU"),
				ExtraKeys: []byte{0x91, 0xc0}, GroupIdx: ptr[int64](0), KVCacheSpecKind: ptr("full_attention"),
			},
			BlockStored{
				BlockHashes: []EngineHash{HashUint(9), HashUint(10)}, ParentBlockHash: &big,
				TokenIDs: cat(tokB, tokA), BlockSize: 16, LoraID: ptr[int64](3), Medium: ptr("CPU"),
				LoraName: ptr("sql-lora"), ExtraKeys: []byte("\x92\x91\xa8sql-lora\x91\xa8sql-lora"),
				GroupIdx: ptr[int64](0), KVCacheSpecKind: ptr("full_attention"),
			},
			BlockRemoved{BlockHashes: []EngineHash{HashUint(9)}, Medium: ptr("CPU"), GroupIdx: ptr[int64](0)},
			AllBlocksCleared{},
		}},
		"map.msgpack": {TS: goldenTS, DPRank: ptr(1), Format: FormatMap, Events: []Event{
			BlockStored{
				BlockHashes: []EngineHash{HashUint(1)}, TokenIDs: tokA, BlockSize: 16, Medium: ptr("GPU"),
				ExtraKeys: []byte("\x91\x91\xa8tenant-b"),
			},
			BlockRemoved{BlockHashes: []EngineHash{HashUint(1)}, Medium: ptr("GPU")},
		}},
		"bytes_hashes.msgpack": {TS: goldenTS, Format: FormatArray, Events: []Event{
			BlockStored{
				BlockHashes: []EngineHash{sha("a"), sha("b")}, ParentBlockHash: ptr(sha("root")),
				TokenIDs: cat(tokA, tokB), BlockSize: 16, Medium: ptr("GPU"),
				GroupIdx: ptr[int64](0), KVCacheSpecKind: ptr("full_attention"),
			},
		}},
	}
}

func TestGoldenFramesDecodeToVLLMValues(t *testing.T) {
	for name, want := range goldenBatches(t) {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeBatch(data)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded\n%#v\nwant\n%#v", got, want)
			}
		})
	}
}

func TestEncodeReproducesGoldenBytes(t *testing.T) {
	for name, b := range goldenBatches(t) {
		t.Run(name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := EncodeBatch(b)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoded\n%x\nwant\n%x", got, want)
			}
		})
	}
}

func TestIntegerEncodingFollowsMsgspec(t *testing.T) {
	tests := []struct {
		v    int64
		want string
	}{
		{0, "00"}, {127, "7f"}, {128, "cc80"}, {255, "ccff"}, {256, "cd0100"},
		{65535, "cdffff"}, {65536, "ce00010000"}, {1 << 32, "cf0000000100000000"},
		{-1, "ff"}, {-32, "e0"}, {-33, "d0df"}, {-128, "d080"}, {-129, "d1ff7f"},
		{-32768, "d18000"}, {-32769, "d2ffff7fff"}, {-(1 << 31) - 1, "d3ffffffff7fffffff"},
	}
	for _, tt := range tests {
		got := appendInt(nil, tt.v)
		if h := hex(got); h != tt.want {
			t.Errorf("appendInt(%d) = %s, want %s", tt.v, h, tt.want)
		}
	}
	if h := hex(appendStr(nil, string(make([]byte, 32)))[:2]); h != "d920" {
		t.Errorf("32-byte string header = %s, want d920 (str8)", h)
	}
}

func hex(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func TestDecodeRejectsMalformedBatches(t *testing.T) {
	valid, err := os.ReadFile(filepath.Join("testdata", "array_v023.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"not a container", []byte{0x01}},
		{"truncated", valid[:len(valid)-3]},
		{"trailing bytes", append(append([]byte{}, valid...), 0x00)},
		{"one field", mustRaw(t, []any{1.0})},
		{"ts not a number", mustRaw(t, []any{"x", []any{}})},
		{"events not an array", mustRaw(t, []any{1.0, 3})},
		{"unknown tag", mustRaw(t, []any{1.0, []any{[]any{"BlockExploded", []any{1}}}})},
		{"stored too short", mustRaw(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{}}}})},
		{"string hash", mustRaw(t, []any{1.0, []any{[]any{"BlockRemoved", []any{"h"}}}})},
		{"negative token", mustRaw(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1, nil}}})},
		{"huge array header", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"map without type", mustRaw(t, []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}})},
		{"map batch without events", mustRaw(t, map[string]any{"ts": 1.0})},
		{"deep nesting in extra", deepNest(200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeBatch(tt.data)
			if err == nil {
				t.Fatal("want an error")
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

// deepNest builds a batch whose BlockStored carries an unknown trailing
// field nested n arrays deep.
func deepNest(n int) []byte {
	var b []byte
	b = appendArrayHeader(b, 2)
	b = appendFloat(b, 1)
	b = appendArrayHeader(b, 1)
	b = appendArrayHeader(b, 13)
	b = appendStr(b, "BlockStored")
	b = appendArrayHeader(b, 0)
	b = append(b, 0xc0)
	b = appendArrayHeader(b, 0)
	b = append(b, 1, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0)
	for i := 0; i < n; i++ {
		b = appendArrayHeader(b, 1)
	}
	return append(b, 0xc0)
}

func TestDecodeKeepsUnknownFieldsForByteIdenticalReencode(t *testing.T) {
	var b []byte
	b = appendArrayHeader(b, 3)
	b = appendFloat(b, 2.5)
	b = appendArrayHeader(b, 2)
	// A BlockStored from a future vLLM with two more positional fields.
	b = appendArrayHeader(b, 14)
	b = appendStr(b, "BlockStored")
	b = appendArrayHeader(b, 1)
	b = appendUint(b, 5)
	b = append(b, 0xc0)
	b = appendArrayHeader(b, 2)
	b = append(b, 1, 2)
	b = append(b, 2, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0)
	b = appendStr(b, "future")
	b = appendArrayHeader(b, 1)
	b = append(b, 7)
	// A map event with an unknown key.
	b = appendMapHeader(b, 4)
	b = appendStr(b, "type")
	b = appendStr(b, "BlockRemoved")
	b = appendStr(b, "block_hashes")
	b = appendArrayHeader(b, 1)
	b = appendUint(b, 5)
	b = appendStr(b, "medium")
	b = append(b, 0xc0)
	b = appendStr(b, "session_id")
	b = appendStr(b, "s1")
	b = append(b, 0xc0)

	got, err := DecodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	st := got.Events[0].(BlockStored)
	if len(st.Unknown) != 2 || string(st.Unknown[0].Value) != "\xa6future" {
		t.Fatalf("stored unknown fields = %+v", st.Unknown)
	}
	rm := got.Events[1].(BlockRemoved)
	if len(rm.Unknown) != 1 || rm.Unknown[0].Name != "session_id" {
		t.Fatalf("removed unknown fields = %+v", rm.Unknown)
	}
	// Mixed layouts re-encode per the batch format, so compare the parts
	// that the format fixes: the array event keeps its bytes.
	again, err := EncodeBatch(got)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeBatch(again)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Events[0], got.Events[0]) {
		t.Fatalf("re-decoded stored event differs:\n%#v\n%#v", back.Events[0], got.Events[0])
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for name := range goldenBatches(f) {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add(deepNest(3))
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeBatch(data)
		if err != nil {
			return
		}
		// Whatever decodes must encode, and decode again to the same value.
		enc, err := EncodeBatch(b)
		if err != nil {
			t.Fatalf("encode of a decoded batch: %v", err)
		}
		b2, err := DecodeBatch(enc)
		if err != nil {
			t.Fatalf("re-decode: %v\n%x", err, enc)
		}
		enc2, err := EncodeBatch(b2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable:\n%x\n%x", enc, enc2)
		}
	})
}

// FuzzEncodeRoundTrip builds batches from fuzzed values in every format and
// checks that they decode back to themselves.
func FuzzEncodeRoundTrip(f *testing.F) {
	f.Add(1.5, uint64(15760518052499183552), int64(-5), []byte("h"), uint32(7), "GPU", "lora", uint8(0), true)
	f.Add(0.0, uint64(0), int64(-1<<40), []byte{}, uint32(1<<31), "", "", uint8(2), false)
	f.Fuzz(func(t *testing.T, ts float64, u uint64, i int64, raw []byte, tok uint32, medium, lora string, format uint8, dp bool) {
		if ts != ts { // NaN never compares equal
			ts = 0
		}
		stored := BlockStored{
			BlockHashes: []EngineHash{HashUint(u), HashInt(i), HashBytes(raw)},
			TokenIDs:    []uint32{tok, tok / 2, 0}, BlockSize: 1,
			Medium: ptr(medium), LoraName: ptr(lora),
		}
		if u%2 == 0 {
			stored.ParentBlockHash = ptr(HashInt(i))
			stored.ExtraKeys = mustRaw(t, []any{[]any{lora}, nil, nil})
			stored.GroupIdx = ptr(i)
		}
		b := EventBatch{TS: ts, Format: Format(format % 3), Events: []Event{
			stored,
			BlockRemoved{BlockHashes: []EngineHash{HashBytes(raw)}, Medium: ptr(medium)},
			AllBlocksCleared{},
		}}
		if dp {
			b.DPRank = ptr(int(tok % 1024))
		}
		enc, err := EncodeBatch(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBatch(enc)
		if err != nil {
			t.Fatalf("decode of an encoded batch: %v\n%x", err, enc)
		}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("round trip differs:\n%#v\n%#v", got, b)
		}
	})
}
