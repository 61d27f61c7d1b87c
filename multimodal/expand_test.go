package multimodal

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

type vocab map[string]uint32

func (v vocab) TokenID(s string) (uint32, bool) { id, ok := v[s]; return id, ok }

func TestExpandTokensQwenCutsAtAnUnknownSize(t *testing.T) {
	spec, err := NewSpec(DefaultProcessor(FamilyQwen2VL), vocab{QwenImagePad: 9})
	if err != nil {
		t.Fatal(err)
	}
	toks := []uint32{1, 2, 9, 3, 9, 4}
	out, placed, cut, err := spec.ExpandTokens(nil, toks, []Image{{ID: "a", W: 56, H: 56}, {ID: "b"}})
	if err != nil || !cut {
		t.Fatalf("cut %v err %v", cut, err)
	}
	// 56×56 is 4 pads; the prompt stops before the remote image's pad.
	want := []uint32{1, 2, 9, 9, 9, 9, 3}
	if len(out) != len(want) || len(placed) != 1 || placed[0].Offset != 2 || placed[0].Length != 4 || placed[0].ID != "a" {
		t.Fatalf("out %v placed %+v", out, placed)
	}
	for i := range want {
		if out[i] != want[i] {
			t.Fatalf("out %v", out)
		}
	}
	if _, _, _, err := spec.ExpandTokens(nil, []uint32{1, 9}, []Image{{ID: "a", W: 56, H: 56}, {ID: "b", W: 56, H: 56}}); !errors.Is(err, ErrUnplaced) {
		t.Fatalf("missing placeholder: %v", err)
	}
	if _, err := NewSpec(DefaultProcessor(FamilyGemma3), vocab{}); err == nil {
		t.Fatal("a tokenizer without the family's tokens must be refused")
	}
}

// Two different images of the same size share the prompt up to the first
// placeholder and no further: their tokens are equal, their ids are not.
func TestSameSizeImagesDifferOnlyByIdentity(t *testing.T) {
	cs := loadChats(t)
	body := func(url string) tokenizer.ChatRequest {
		b, _ := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
			map[string]any{"type": "text", "text": "What is it?"}}}}})
		req, err := tokenizer.ParseChatRequest(b)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	a, b := pngDataURL(640, 480), pngDataURL(640, 480)+"AAAA" // same header, other bytes
	for _, fam := range []Family{FamilyQwen2VL, FamilyGemma3} {
		spec, err := NewSpec(DefaultProcessor(fam), cs[fam].Tokenizer())
		if err != nil {
			t.Fatal(err)
		}
		ea, err := EncodeChat(cs[fam], spec, body(a), nil)
		if err != nil {
			t.Fatal(err)
		}
		eb, err := EncodeChat(cs[fam], spec, body(b), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(ea.Tokens) != len(eb.Tokens) || ea.Items[0].ID == eb.Items[0].ID || ea.Placements[0].Offset != eb.Placements[0].Offset {
			t.Fatalf("%s: tokens %d/%d ids %q/%q", fam, len(ea.Tokens), len(eb.Tokens), ea.Items[0].ID, eb.Items[0].ID)
		}
	}
}
