package vllmwire

import (
	"errors"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// storedWithTokens is a batch of one BlockStored of one block whose
// token_ids array is tokens, raw msgpack of n elements.
func storedWithTokens(t *testing.T, n int, tokens []byte) []byte {
	t.Helper()
	arr := appendArrayHeader(nil, n)
	arr = append(arr, tokens...)
	return mustRaw(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, msgpack.RawMessage(arr), n, nil}}})
}

// TestTokenIDsInEveryIntegerForm decodes token ids written in every
// msgpack integer form an encoder may choose, fixints and the unsigned
// forms up to 32 bits (read without intAt) and the rest, mixed in one
// array, and refuses the values that are not token ids in any form.
func TestTokenIDsInEveryIntegerForm(t *testing.T) {
	forms := []struct {
		raw  []byte
		want uint32
	}{
		{[]byte{0x00}, 0},
		{[]byte{0x7f}, 127},
		{[]byte{0xcc, 0x80}, 128},
		{[]byte{0xcc, 0x05}, 5},
		{[]byte{0xcd, 0x01, 0x00}, 256},
		{[]byte{0xcd, 0xff, 0xff}, 65535},
		{[]byte{0xce, 0x00, 0x02, 0x4f, 0x1c}, 151324},
		{[]byte{0xce, 0xff, 0xff, 0xff, 0xff}, 1<<32 - 1},
		{[]byte{0xcf, 0, 0, 0, 0, 0, 0, 0x01, 0x00}, 256},
		{[]byte{0xd0, 0x7f}, 127},
		{[]byte{0xd1, 0x7f, 0xff}, 32767},
		{[]byte{0xd2, 0x7f, 0xff, 0xff, 0xff}, 1<<31 - 1},
		{[]byte{0xd3, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, 1<<32 - 1},
	}
	// Every form alone, then all of them in one array in both orders, so
	// each form is also read just before and just after every other.
	var all []byte
	var want []uint32
	for _, f := range forms {
		got, err := DecodeBatch(storedWithTokens(t, 1, f.raw))
		if err != nil {
			t.Fatalf("% x: %v", f.raw, err)
		}
		if toks := got.Events[0].(BlockStored).TokenIDs; !slices.Equal(toks, []uint32{f.want}) {
			t.Fatalf("% x: token ids %v, want [%d]", f.raw, toks, f.want)
		}
		all = append(all, f.raw...)
		want = append(want, f.want)
	}
	for range 2 {
		got, err := DecodeBatch(storedWithTokens(t, len(want), all))
		if err != nil {
			t.Fatal(err)
		}
		if toks := got.Events[0].(BlockStored).TokenIDs; !slices.Equal(toks, want) {
			t.Fatalf("token ids %v, want %v", toks, want)
		}
		all, want = nil, slices.Clone(want)
		slices.Reverse(want)
		for i := len(forms) - 1; i >= 0; i-- {
			all = append(all, forms[i].raw...)
		}
	}
	for _, raw := range [][]byte{
		{0xff},                            // negative fixint
		{0xd0, 0x80},                      // negative int8
		{0xd3, 0xff, 0, 0, 0, 0, 0, 0, 0}, // negative int64
		{0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0}, // past uint32
		{0xc0},                            // nil
		{0xcb, 0, 0, 0, 0, 0, 0, 0, 0},    // float64
	} {
		if _, err := DecodeBatch(storedWithTokens(t, 1, raw)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("% x: error %v, want ErrMalformed", raw, err)
		}
	}
	// Truncated inside the last token: the fast path must not read past
	// the input.
	for _, raw := range [][]byte{{0xcd, 0x01}, {0xce, 0x00, 0x02, 0x4f}, {0xcc}} {
		arr := appendArrayHeader(nil, 1)
		data := append(mustRaw(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil}}}), arr...)
		data = append(data, raw...)
		if _, err := DecodeBatch(data); err == nil {
			t.Fatalf("% x at the end of the input: no error", raw)
		}
	}
}
