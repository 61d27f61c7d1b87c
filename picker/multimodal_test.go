package picker

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/multimodal"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
)

// pngURL is a data: URL holding a PNG header of w×h (all that sizing reads)
// followed by tail, which makes two images of one size differ.
func pngURL(w, h int, tail string) string {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2
	b := []byte("\x89PNG\r\n\x1a\n")
	b = binary.BigEndian.AppendUint32(b, 13)
	chunk := append([]byte("IHDR"), ihdr[:]...)
	b = append(b, chunk...)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(chunk))
	b = append(b, tail...)
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b)
}

func imageChat(url, text string) string {
	body, _ := json.Marshal(map[string]any{"model": testModel, "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": text},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
	}}}})
	return string(body)
}

func vlRig(t testing.TB, declared bool) *testRig {
	reg, err := NewTokenizerRegistry(map[string]tokenizer.ModelSource{testModel: {Dir: qwenDir, ChatTemplate: "../multimodal/testdata/qwen2.5-vl.jinja"}}, tokenizer.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return newRig(t, func(_ *scoring.Options, c *Config) {
		c.Tokenizers = reg
		if declared {
			c.Multimodal = map[string]MultimodalModel{testModel: {Processor: multimodal.DefaultProcessor(multimodal.FamilyQwen2VL), InjectUUID: true}}
		}
	})
}

func TestPickerRoutesImagesByTheirBlocks(t *testing.T) {
	rg := vlRig(t, true)
	ctx := context.Background()
	imgA := pngURL(640, 480, "cat")
	body := imageChat(imgA, "Describe the picture in detail, please.")
	d, err := rg.picker.Decide(ctx, chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free("ok")
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(imgA, "data:image/png;base64,"))
	sum := sha256.Sum256(raw)
	id := hex.EncodeToString(sum[:])
	if !strings.Contains(string(d.Body), `{"uuid":"`+id+`",`) {
		t.Fatalf("body not rewritten with the image's uuid:\n%.300s", d.Body)
	}
	if strings.Replace(string(d.Body), `"uuid":"`+id+`",`, "", 1) != body {
		t.Fatal("the rest of the body must be kept byte for byte")
	}
	if len(rg.metrics.byLoad) != 0 {
		t.Fatalf("routed by load: %v", rg.metrics.byLoad)
	}

	// The engine on w1 caches the request's blocks, keyed by the uuid.
	chat, err := rg.picker.cfg.Tokenizers.Get(testModel)
	if err != nil {
		t.Fatal(err)
	}
	creq, err := tokenizer.ParseChatRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := multimodal.NewSpec(multimodal.DefaultProcessor(multimodal.FamilyQwen2VL), chat.Tokenizer())
	enc, err := multimodal.EncodeChat(chat, spec, creq, nil)
	if err != nil {
		t.Fatal(err)
	}
	blocks := len(enc.Tokens) / 16
	hs := make([]vllmwire.EngineHash, blocks)
	for i := range hs {
		hs[i] = vllmwire.HashUint(uint64(5000 + i))
	}
	keys := kvindex.MMBlockKeys(enc.Placements, len(enc.Tokens), 16)
	st := rg.index.Apply("w1", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{
		BlockHashes: hs, TokenIDs: enc.Tokens[:blocks*16], BlockSize: 16, ExtraKeys: kvindex.EncodeMMExtraKeys(keys, blocks),
	}}})
	if st.StoredBlocks != blocks {
		t.Fatalf("stored %+v", st)
	}
	d, err = rg.picker.Decide(ctx, chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free("ok")
	if d.Cluster != "w1" || d.CachedTokens != blocks*16 {
		t.Fatalf("routed to %s with %d cached tokens, want w1 with %d", d.Cluster, d.CachedTokens, blocks*16)
	}

	// Another image of the same size: same tokens, but the prefix ends
	// before the block holding the first image token.
	d, err = rg.picker.Decide(ctx, chatReq(imageChat(pngURL(640, 480, "dog"), "Describe the picture in detail, please.")))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free("ok")
	if first := enc.Placements[0].Offset / 16 * 16; d.CachedTokens > first {
		t.Fatalf("a different image shares %d cached tokens, past its first placeholder block at %d", d.CachedTokens, first)
	}

	// A client uuid is used as is and not rewritten.
	withUUID := strings.Replace(body, `{"image_url"`, `{"uuid":"client-1","image_url"`, 1)
	d, err = rg.picker.Decide(ctx, chatReq(withUUID))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free("ok")
	if d.Body != nil {
		t.Fatalf("a body with client uuids must not be rewritten: %.200s", d.Body)
	}
}

func TestPickerRoutesUndeclaredImageModelsByLoad(t *testing.T) {
	rg := vlRig(t, false)
	d, err := rg.picker.Decide(context.Background(), chatReq(imageChat(pngURL(64, 64, ""), "hi")))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free("ok")
	if rg.metrics.byLoad["multimodal_undeclared"] != 1 || d.Body != nil {
		t.Fatalf("by load %v body %q", rg.metrics.byLoad, d.Body)
	}
}

// A remote image is not fetched: its size is unknown, so the prompt is
// matched up to it, and its uuid is the SHA-256 of its address.
func TestPickerMatchesUpToARemoteImage(t *testing.T) {
	rg := vlRig(t, true)
	url := "https://images.example.com/cat.png"
	body := imageChat(url, "Describe the picture in detail, please.")
	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free("ok")
	sum := sha256.Sum256([]byte(url))
	if !strings.Contains(string(d.Body), `"uuid":"`+hex.EncodeToString(sum[:])+`"`) {
		t.Fatalf("no uuid for the remote image: %.300s", d.Body)
	}
	x, err := rg.picker.Explain(chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	// System prompt, the user's text and <|vision_start|>: a few dozen
	// tokens, never the image's hundreds.
	if x.PromptTokens == 0 || x.PromptTokens > 64 {
		t.Fatalf("prompt matched over %d tokens, want only the text before the remote image", x.PromptTokens)
	}
}

// With "messages" given twice the engine reads the last (Python's json
// keeps the last value of a key), so that is where the uuid goes.
func TestPickerInjectsUUIDsIntoTheMessagesTheEngineReads(t *testing.T) {
	rg := vlRig(t, true)
	last := imageChat("https://x/last.png", "hi")
	body := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/first.png"}}]}],` + last[1:]
	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free("ok")
	sum := sha256.Sum256([]byte("https://x/last.png"))
	want := `"uuid":"` + hex.EncodeToString(sum[:]) + `",`
	i := strings.Index(string(d.Body), want)
	if i < strings.Index(string(d.Body), "first.png") || strings.Count(string(d.Body), `"uuid"`) != 1 {
		t.Fatalf("uuid not in the last messages' image part:\n%s", d.Body)
	}
	if strings.Replace(string(d.Body), want, "", 1) != body {
		t.Fatal("the rest of the body must be kept byte for byte")
	}
}
