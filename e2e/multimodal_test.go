package e2e

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/multimodal"
)

const vlTemplate = "../multimodal/testdata/qwen2.5-vl.jinja"

// pngImage is a data: URL of a PNG header of w×h (all the processors'
// sizing reads) followed by tag, which tells same-size images apart.
func pngImage(w, h int, tag string) string {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2
	b := []byte("\x89PNG\r\n\x1a\n")
	b = binary.BigEndian.AppendUint32(b, 13)
	chunk := append([]byte("IHDR"), ihdr[:]...)
	b = append(b, chunk...)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(chunk))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(append(b, tag...))
}

// imageChat is a streaming chat: a system prompt, a first user turn with
// an image and a question, then the further turns (assistant, user, ...).
func imageChat(system, image, q1 string, more ...string) []byte {
	msgs := []any{
		map[string]any{"role": "system", "content": system},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": image}},
			map[string]any{"type": "text", "text": q1},
		}},
	}
	for i, t := range more {
		role := "assistant"
		if i%2 == 1 {
			role = "user"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": t})
	}
	b, _ := json.Marshal(map[string]any{
		"model": model, "messages": msgs, "max_tokens": 8, "ignore_eos": true, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	return b
}

// A multi-turn image chat through Envoy to kvsim serving a
// Qwen2.5-VL-style model: the router expands the image, injects its uuid,
// hashes its blocks with it; kvsim keys its cache and events by the same
// uuid. Second turns land where the first turn's image blocks are, with
// the predicted cached tokens equal to kvsim's for at least 95 % of them;
// another image of the same size shares no predicted prefix past its
// placeholder.
func TestImageChatSecondTurnFollowsImageBlocks(t *testing.T) {
	for _, tc := range []struct{ name, style string }{
		{"buffered", envoy.StyleClusterHeader},
		{"full_duplex_streamed", envoy.StyleOriginalDst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, options{workers: 4, style: tc.style, mmFamily: "qwen2.5-vl", chatTemplate: vlTemplate})
			sizes := [][2]int{{640, 480}, {1024, 768}, {480, 640}, {800, 600}, {1280, 720}, {336, 336}}
			type conv struct {
				system, image string
				first         bench.Result
			}
			convs := make([]*conv, len(sizes))
			exact, predicted := 0, 0
			count := func(r bench.Result) {
				if r.PredictedCached != nil {
					predicted++
					if *r.PredictedCached == r.CachedTokens {
						exact++
					}
				}
			}
			for i, sz := range sizes {
				c := &conv{system: longText(fmt.Sprintf("vision persona %d", i), 6), image: pngImage(sz[0], sz[1], fmt.Sprintf("photo-%d", i))}
				c.first = s.send(t, imageChat(c.system, c.image, "What is in this picture?"))
				if c.first.CachedTokens != 0 || c.first.PromptTokens < 200 {
					t.Fatalf("conversation %d: first turn %d prompt tokens, %d cached", i, c.first.PromptTokens, c.first.CachedTokens)
				}
				count(c.first)
				convs[i] = c
			}
			for i, c := range convs {
				eventually(t, "the router to index the first turn's blocks", func() bool {
					blocks, _, _ := s.indexed(c.first.Worker)
					return blocks*16 >= c.first.PromptTokens/16*16
				})
				second := s.send(t, imageChat(c.system, c.image, "What is in this picture?", "A landscape.", "Which colours dominate?"))
				count(second)
				if second.Worker != c.first.Worker {
					t.Errorf("conversation %d: second turn went to %s, the image blocks are on %s", i, second.Worker, c.first.Worker)
				}
				if want := c.first.PromptTokens / 16 * 16; second.CachedTokens < want {
					t.Errorf("conversation %d: second turn reused %d tokens, the first turn's %d full-block tokens are cached", i, second.CachedTokens, want)
				}
			}
			if predicted == 0 || float64(exact) < 0.95*float64(predicted) {
				t.Errorf("overlap_exact %d of %d predictions, want at least 95 %%", exact, predicted)
			}
			t.Logf("overlap_exact: %d of %d requests (%.1f %%)", exact, predicted, 100*float64(exact)/float64(max(predicted, 1)))

			// Same system prompt and size, another image: no predicted
			// prefix past the block before its first placeholder.
			c := convs[0]
			enc, err := sim.LoadChatEncoder(qwenDir, vlTemplate)
			if err != nil {
				t.Fatal(err)
			}
			if err := enc.SetMultimodal(multimodal.FamilyQwen2VL); err != nil {
				t.Fatal(err)
			}
			other := imageChat(c.system, pngImage(sizes[0][0], sizes[0][1], "another photo"), "What is in this picture?")
			_, mm, err := enc.EncodeChatMM(other)
			if err != nil || len(mm) != 1 {
				t.Fatalf("encode: %v %v", mm, err)
			}
			r := s.send(t, other)
			if r.PredictedCached == nil || *r.PredictedCached > mm[0].Offset/16*16 || r.CachedTokens > mm[0].Offset/16*16 {
				t.Errorf("a different image of the same size: predicted %v, cached %d, the placeholder starts at %d",
					r.PredictedCached, r.CachedTokens, mm[0].Offset)
			}
		})
	}
}
