package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/multimodal"
)

func simPNG(w, h int, tail string) string {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2
	b := []byte("\x89PNG\r\n\x1a\n")
	b = binary.BigEndian.AppendUint32(b, 13)
	chunk := append([]byte("IHDR"), ihdr[:]...)
	b = append(b, chunk...)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(chunk))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(append(b, tail...))
}

func imageBody(url string) string {
	b, _ := json.Marshal(map[string]any{"model": "test-model", "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
		map[string]any{"type": "text", "text": "What is in the picture?"}}}}})
	return string(b)
}

func cachedTokensOf(t *testing.T, data []byte) (prompt, cached int) {
	t.Helper()
	var resp struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
	return resp.Usage.PromptTokens, resp.Usage.Details.CachedTokens
}

// kvsim expands images like the processor and keys their blocks by the
// image's identity: a repeated image is a cache hit, another image of the
// same size is not (past the blocks before it).
func TestWorkerCachesImagesByIdentity(t *testing.T) {
	enc, err := LoadChatEncoder("../../tokenizer/testdata/qwen3", "../../multimodal/testdata/qwen2.5-vl.jinja")
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.SetMultimodal(multimodal.FamilyQwen2VL); err != nil {
		t.Fatal(err)
	}
	w := startTestWorker(t, WorkerConfig{Encoder: enc, Engine: EngineConfig{NumGPUBlocks: 512, BlockSize: 16}})
	cat := imageBody(simPNG(640, 480, "cat"))
	resp, data := post(t, w.URL()+"/v1/chat/completions", cat)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	prompt, cached := cachedTokensOf(t, data)
	if prompt < 391 || cached != 0 {
		t.Fatalf("first: prompt %d cached %d; 640×480 alone is 391 image tokens", prompt, cached)
	}
	_, data = post(t, w.URL()+"/v1/chat/completions", cat)
	if _, cached := cachedTokensOf(t, data); cached != prompt/16*16 {
		t.Fatalf("repeat: cached %d, want %d", cached, prompt/16*16)
	}
	_, data = post(t, w.URL()+"/v1/chat/completions", imageBody(simPNG(640, 480, "dog")))
	ids, mm, err := enc.EncodeChatMM([]byte(cat))
	if err != nil || len(mm) != 1 || len(ids) != prompt {
		t.Fatalf("encode: %d ids %v %v", len(ids), mm, err)
	}
	if _, cached := cachedTokensOf(t, data); cached > mm[0].Offset/16*16 {
		t.Fatalf("another image of the same size hit %d cached tokens, past its placeholder at %d", cached, mm[0].Offset)
	}
}

// BlockStored events carry the blocks' image keys as vLLM's extra_keys,
// and the router's index, fed those events, matches the request's hashes.
func TestEngineEventsCarryImageKeys(t *testing.T) {
	var got []vllmwire.Event
	eng, err := NewEngine(EngineConfig{NumGPUBlocks: 64, BlockSize: 4}, EventSinkFunc(func(e Event) { got = append(got, toKVIndex(e)) }))
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, 30)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	mm := []kvindex.MMPlacement{{ID: "img-1", Offset: 6, Length: 9}}
	if err := eng.AddMM(1, prompt, 1, mm); err != nil {
		t.Fatal(err)
	}
	for eng.HasWork() {
		eng.Step()
	}
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w", "m", 4)
	ix.Apply("w", vllmwire.EventBatch{Events: got})
	toks := make([]uint32, 30)
	for i := range toks {
		toks[i] = uint32(prompt[i])
	}
	req := kvindex.HashBlocksMM(kvindex.Seed("m", "", ""), toks, 4, kvindex.MMBlockKeys(mm, 30, 4), nil)
	if res := ix.Match(req, []string{"w"}, nil); res[0].Blocks != 7 {
		t.Fatalf("index matched %d of 7 blocks", res[0].Blocks)
	}
}
