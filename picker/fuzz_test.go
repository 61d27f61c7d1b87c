package picker

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/multimodal"
	"github.com/kvroute/kvroute/tokenizer"
)

func FuzzParseBody(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","prompt":[[1,2,3],[4]],"max_tokens":5,"nvext":{"agent_hints":{"priority":2}}}`))
	f.Add([]byte(`{"model":"m","prompt":[-1, 99999999999]}`))
	f.Add([]byte(`{"model":"m","prompt":["a", 5]}`))
	f.Add([]byte(`{"model":"m","prompt":[]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"tools":[{"type":"function"}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"},"uuid":null}]}]}`))
	f.Add([]byte(`[1,2`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseBody(body)
		if err != nil {
			return
		}
		if r.MaxTokens < 0 {
			t.Fatalf("negative max tokens from %q: %+v", body, r)
		}
		if p, ok := routePrompt(&r); ok != (len(r.Prompts) > 0) || (!p.IsIDs && p.IDs != nil) {
			t.Fatalf("prompt %+v, %v from %+v", p, ok, r.Prompts)
		}
		if r.PromptErr == nil && len(r.Prompts) == 0 {
			t.Fatal("no prompt and no reason")
		}
		chat, err := r.Chat()
		if err != nil {
			return
		}
		for _, part := range imageParts(&chat) {
			if part.Offset <= 0 || part.Offset >= len(body) || body[part.Offset] != '{' {
				t.Fatalf("image part at %d, not at a '{' of %q", part.Offset, body)
			}
		}
		if again, err := r.Chat(); err != nil || len(again.Messages) != len(chat.Messages) {
			t.Fatal("Chat read twice differs")
		}
	})
}

// FuzzInjectUUIDs rewrites bodies as the picker does for a vision-language
// model and reads them back: the same chat, every image part with a uuid.
func FuzzInjectUUIDs(f *testing.F) {
	f.Add([]byte(imageChat("https://x/y.png", "hi")), "id")
	f.Add([]byte(`{"messages":[{"role":"user","content":[{}, {"type":"image_url","image_url":"u"}]}]}`), "x")
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"u","uuid":null},{"image_url":"v","type":"image_url"}]}],"messages":[]}`), "x")
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"a"}]}],"messages":[{"role":"user","content":[{ "type" : "image_url" ,"image_url":"b"}]}]}`), "q\"")
	f.Fuzz(func(t *testing.T, body []byte, id string) {
		r, err := tokenizer.ParseRequest(body)
		if err != nil {
			return
		}
		chat, err := r.Chat()
		if err != nil {
			return
		}
		parts := imageParts(&chat)
		items := make([]multimodal.Item, len(parts))
		for i := range items {
			items[i] = multimodal.Item{ID: id, Derived: true}
		}
		out, err := injectUUIDs(body, parts, items)
		if err != nil {
			t.Fatal(err)
		}
		if out == nil {
			for _, p := range parts {
				if !p.HasUUIDKey {
					t.Fatalf("part %+v left without a uuid", p)
				}
			}
			return
		}
		if json.Valid(body) && !json.Valid(out) {
			t.Fatalf("valid body became invalid:\n%s\n%s", body, out)
		}
		r2, err := tokenizer.ParseRequest(out)
		if err != nil {
			t.Fatalf("rewritten body does not decode: %v\n%s", err, out)
		}
		chat2, err := r2.Chat()
		if err != nil {
			t.Fatalf("rewritten body's chat: %v\n%s", err, out)
		}
		parts2 := imageParts(&chat2)
		if len(parts2) != len(parts) || len(chat2.Messages) != len(chat.Messages) {
			t.Fatalf("%d image parts, then %d", len(parts), len(parts2))
		}
		for i, p := range parts2 {
			if !p.HasUUIDKey || p.URL != parts[i].URL || p.At != parts[i].At {
				t.Fatalf("part %d: %+v, was %+v", i, p, parts[i])
			}
			if !parts[i].HasUUIDKey && utf8.ValidString(id) && p.UUID != id {
				t.Fatalf("part %d: uuid %q, want %q", i, p.UUID, id)
			}
		}
	})
}
