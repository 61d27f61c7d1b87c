package sim

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// The tokenizer package's test data holds real Hugging Face tokenizers.
const tokenizerData = "../../tokenizer/testdata/"

func TestPromptsAreTokenizedAsVLLMDoes(t *testing.T) {
	chatBody := `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Where is Paris?"}],"max_tokens":3}`
	tests := []struct {
		name string
		dir  string
		chat bool
		body string
		want func(c *tokenizer.Chat) []uint32
	}{
		{"chat is rendered with the template, no special tokens added", "qwen3", true, chatBody,
			func(c *tokenizer.Chat) []uint32 {
				req, err := tokenizer.ParseChatRequest([]byte(chatBody))
				if err != nil {
					t.Fatal(err)
				}
				text, err := c.ApplyChatTemplate(req)
				if err != nil {
					t.Fatal(err)
				}
				return c.Tokenizer().Encode(text, false)
			}},
		{"completions text gets special tokens (BOS)", "mistral-sp", false, `{"prompt":"Where is Paris?"}`,
			func(c *tokenizer.Chat) []uint32 { return c.Tokenizer().Encode("Where is Paris?", true) }},
		{"token ids are taken as is", "qwen3", false, `{"prompt":[5,6,7]}`,
			func(*tokenizer.Chat) []uint32 { return []uint32{5, 6, 7} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc, err := LoadChatEncoder(tokenizerData+tt.dir, "")
			if err != nil {
				t.Fatal(err)
			}
			w := &Worker{encoder: enc}
			var req apiRequest
			if err := json.Unmarshal([]byte(tt.body), &req); err != nil {
				t.Fatal(err)
			}
			got, _, err := w.prompt([]byte(tt.body), req, tt.chat, 3)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want(enc.Chat)
			if !slices.Equal(toUint32(got), want) {
				t.Fatalf("ids %v, want %v", got, want)
			}
			if tt.dir == "mistral-sp" && slices.Equal(want, enc.Chat.Tokenizer().Encode("Where is Paris?", false)) {
				t.Fatal("test is vacuous: with and without special tokens agree")
			}
		})
	}
}
