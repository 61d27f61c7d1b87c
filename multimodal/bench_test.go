package multimodal

import (
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/tokenizer"
)

// BenchmarkEncodeChat is the router's added work for an image chat: parse,
// identify (SHA-256 of the data: bytes), read the size, render, tokenize,
// expand, place, and hash the blocks with the image keys.
func BenchmarkEncodeChat(b *testing.B) {
	cs := loadChats(b)
	for _, fam := range []Family{FamilyQwen2VL, FamilyGemma3} {
		b.Run(fam.String(), func(b *testing.B) {
			body, _ := json.Marshal(map[string]any{"messages": []any{
				map[string]any{"role": "user", "content": []any{
					map[string]any{"type": "image_url", "image_url": map[string]any{"url": pngDataURL(1920, 1080)}},
					map[string]any{"type": "text", "text": "Describe this picture in a few sentences, please."}}}}})
			spec, err := NewSpec(DefaultProcessor(fam), cs[fam].Tokenizer())
			if err != nil {
				b.Fatal(err)
			}
			var dst []uint32
			var hashes []uint64
			b.ReportAllocs()
			for b.Loop() {
				req, err := tokenizer.ParseChatRequest(body)
				if err != nil {
					b.Fatal(err)
				}
				enc, err := EncodeChat(cs[fam], spec, req, dst[:0])
				if err != nil {
					b.Fatal(err)
				}
				dst = enc.Tokens
				hashes = kvindex.HashBlocksMM(1, enc.Tokens, 16, kvindex.MMBlockKeys(enc.Placements, len(enc.Tokens), 16), hashes[:0])
			}
		})
	}
}
