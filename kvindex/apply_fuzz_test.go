package kvindex

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
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

// FuzzApplyBatch applies whatever the codec decodes: neither applying nor
// reading the salt and multimodal keys from extra_keys may panic. The
// codec's own round-trip target is vllmwire's FuzzDecodeBatch.
func FuzzApplyBatch(f *testing.F) {
	stored := vllmwire.BlockStored{
		BlockHashes: []vllmwire.EngineHash{vllmwire.HashUint(1), vllmwire.HashUint(2)},
		TokenIDs:    make([]uint32, 32), BlockSize: 16, Medium: ptr(vllmwire.MediumGPU),
		ExtraKeys: mustRaw(f, []any{[]any{"salt", []any{"img", int64(3)}}, nil}),
	}
	for format := vllmwire.Format(0); format < 3; format++ {
		data, err := vllmwire.EncodeBatch(vllmwire.EventBatch{TS: 1, Format: format, Events: []vllmwire.Event{
			stored,
			vllmwire.BlockRemoved{BlockHashes: []vllmwire.EngineHash{vllmwire.HashUint(2)}},
			vllmwire.AllBlocksCleared{},
		}})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := vllmwire.DecodeBatch(data)
		if err != nil {
			return
		}
		for _, ev := range b.Events {
			if st, ok := ev.(vllmwire.BlockStored); ok {
				_ = cacheSalt(st.ExtraKeys, "x")
				_, _, _ = BlockMMKeys(st.ExtraKeys, "x", len(st.BlockHashes), st.ParentBlockHash == nil)
			}
		}
		ix := New(Config{})
		ix.AddWorker("w", "m", 16)
		ix.Apply("w", b)
	})
}
