package kvindex

import (
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

func TestMMBlockKeysFollowsVLLM(t *testing.T) {
	// Block size 4. Image a covers tokens [2, 8): blocks 0 and 1 and ends on
	// the boundary of block 2, which it must not key. Image b covers [8, 9)
	// and image c [9, 14): both key block 2; c also keys block 3.
	items := []MMPlacement{{"a", 2, 6}, {"b", 8, 1}, {"c", 9, 5}}
	got := MMBlockKeys(items, 20, 4)
	want := [][]MMKey{
		{{"a", 2}},
		{{"a", -2}},
		{{"b", 0}, {"c", 1}},
		{{"c", -3}},
		nil,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("keys:\n got %v\nwant %v", got, want)
	}
	if MMBlockKeys(nil, 20, 4) != nil || MMBlockKeys(items, 3, 4) != nil {
		t.Fatal("no items or no full block must give nil")
	}
}

func TestHashBlocksMMTextPrefixUnchanged(t *testing.T) {
	seed := Seed(testModel, "", "")
	toks := doc(1, 6)
	keys := MMBlockKeys([]MMPlacement{{"img", 9, 6}}, len(toks), testBS) // blocks 2, 3
	plain := HashBlocks(seed, toks, testBS, nil)
	mm := HashBlocksMM(seed, toks, testBS, keys, nil)
	if !reflect.DeepEqual(plain[:2], mm[:2]) {
		t.Fatal("blocks before the image must hash as text")
	}
	for i := 2; i < 6; i++ {
		if plain[i] == mm[i] {
			t.Fatalf("block %d: the image id must change the chain", i)
		}
	}
	other := HashBlocksMM(seed, toks, testBS, MMBlockKeys([]MMPlacement{{"img2", 9, 6}}, len(toks), testBS), nil)
	if other[2] == mm[2] || !reflect.DeepEqual(other[:2], mm[:2]) {
		t.Fatal("two images of the same size must share the prefix only up to the first image block")
	}
}

// A request and the events of its own blocks give identical hashes, in
// every extra_keys layout vLLM has shipped and every batch format.
func TestMMEventsMatchRequest(t *testing.T) {
	toks := doc(7, 8)
	items := []MMPlacement{{"uuid-cat", 5, 9}, {"sha256:ab", 14, 12}} // blocks 1..6
	keys := MMBlockKeys(items, len(toks), testBS)
	layouts := map[string]msgpack.RawMessage{
		"tuples": EncodeMMExtraKeys(keys, 8),
		"bare":   bareExtraKeys(t, keys, 8, "", ""),
	}
	for _, salt := range []string{"", "tenant"} {
		req := HashBlocksMM(Seed(testModel, "", salt), toks, testBS, keys, nil)
		if salt != "" {
			layouts = map[string]msgpack.RawMessage{
				"tuples+salt": withSalt(t, keys, 8, salt),
				"bare+salt":   bareExtraKeys(t, keys, 8, "", salt),
			}
		}
		for name, extra := range layouts {
			for format := vllmwire.Format(0); format < 3; format++ {
				ev := vllmwire.BlockStored{TokenIDs: toks, BlockSize: testBS, ExtraKeys: extra}
				for j := 0; j < 8; j++ {
					ev.BlockHashes = append(ev.BlockHashes, engineOf(7, j))
				}
				enc, err := vllmwire.EncodeBatch(vllmwire.EventBatch{TS: 1, Format: format, Events: []vllmwire.Event{ev}})
				if err != nil {
					t.Fatal(err)
				}
				b, err := vllmwire.DecodeBatch(enc)
				if err != nil {
					t.Fatalf("%s/%s: %v", name, format, err)
				}
				ix := New(Config{})
				ix.AddWorker("w", testModel, testBS)
				if st := ix.Apply("w", b); st.StoredBlocks != 8 {
					t.Fatalf("%s/%s: stored %+v", name, format, st)
				}
				res := ix.Match(req, []string{"w"}, nil)
				if res[0].Blocks != 8 {
					t.Fatalf("%s/%s salt %q: matched %d of 8 blocks", name, format, salt, res[0].Blocks)
				}
				// Another image of the same size: the prefix ends at block 1.
				other := HashBlocksMM(Seed(testModel, "", salt), toks, testBS,
					MMBlockKeys([]MMPlacement{{"uuid-dog", 5, 9}, items[1]}, len(toks), testBS), nil)
				if res := ix.Match(other, []string{"w"}, nil); res[0].Blocks != 1 {
					t.Fatalf("%s/%s: a different image matched %d blocks, want 1", name, format, res[0].Blocks)
				}
			}
		}
	}
}

// Events chained from a parent (a later BlockStored of the same request)
// carry the keys of their own blocks only.
func TestMMEventsChained(t *testing.T) {
	toks := doc(3, 6)
	keys := MMBlockKeys([]MMPlacement{{"x", 6, 10}}, len(toks), testBS) // blocks 1..3
	req := HashBlocksMM(Seed(testModel, "", ""), toks, testBS, keys, nil)
	ix := New(Config{})
	ix.AddWorker("w", testModel, testBS)
	first, second := storeEv(3, 0, 2), storeEv(3, 2, 6)
	first.ExtraKeys = EncodeMMExtraKeys(keys[:2], 2)
	second.ExtraKeys = EncodeMMExtraKeys(keys[2:], 4)
	ix.Apply("w", vllmwire.EventBatch{Events: []vllmwire.Event{first, second}})
	if res := ix.Match(req, []string{"w"}, nil); res[0].Blocks != 6 {
		t.Fatalf("matched %d of 6", res[0].Blocks)
	}
}

func TestBlockMMKeysRejectsBadShapes(t *testing.T) {
	for name, v := range map[string]any{
		"not a list":     "x",
		"entry not list": []any{"x"},
		"short tuple":    []any{[]any{[]any{"id"}}},
		"id not string":  []any{[]any{[]any{1, 2}}},
		"too many":       []any{nil, nil, nil},
	} {
		raw, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := BlockMMKeys(raw, "", 2, true); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// LoRA name and byte strings are not mm keys.
	raw, _ := msgpack.Marshal([]any{[]any{"lora", []byte{1, 2}}, nil})
	if k, salt, err := BlockMMKeys(raw, "lora", 2, true); err != nil || k != nil || salt != "" {
		t.Fatalf("got %v %q %v", k, salt, err)
	}
}

func FuzzBlockMMKeys(f *testing.F) {
	f.Add([]byte(EncodeMMExtraKeys([][]MMKey{{{"a", 1}}, nil}, 2)), "", true)
	f.Add([]byte("\x92\x92\xa4lora\xa1a\xc0"), "lora", false)
	f.Fuzz(func(t *testing.T, data []byte, lora string, root bool) {
		keys, _, err := BlockMMKeys(data, lora, 4, root)
		if err != nil {
			return
		}
		if len(keys) > 4 {
			t.Fatalf("%d entries for 4 blocks", len(keys))
		}
		_ = HashBlocksMM(1, make([]uint32, 16), 4, keys, nil)
	})
}

func withSalt(t *testing.T, keys [][]MMKey, n int, salt string) msgpack.RawMessage {
	list := make([]any, n)
	for i := 0; i < n; i++ {
		var tup []any
		if i < len(keys) {
			for _, k := range keys[i] {
				tup = append(tup, []any{k.ID, int64(k.Offset)})
			}
		}
		if i == 0 {
			tup = append(tup, salt)
		}
		if tup != nil {
			list[i] = tup
		}
	}
	raw, err := msgpack.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// bareExtraKeys is the layout before vLLM added the offset: lora name, bare
// identifiers, then the salt on the first block.
func bareExtraKeys(t *testing.T, keys [][]MMKey, n int, lora, salt string) msgpack.RawMessage {
	list := make([]any, n)
	for i := 0; i < n; i++ {
		var tup []any
		if lora != "" {
			tup = append(tup, lora)
		}
		if i < len(keys) {
			for _, k := range keys[i] {
				tup = append(tup, k.ID)
			}
		}
		if i == 0 && salt != "" {
			tup = append(tup, salt)
		}
		if tup != nil {
			list[i] = tup
		}
	}
	raw, err := msgpack.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
