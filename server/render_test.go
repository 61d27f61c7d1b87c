package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

func TestDecodeRenderRequest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kind    renderKind
		body    string
		prompts int    // completions: prompts read
		ids     bool   // completions: the first prompt is token ids
		code    string // the error's code; "" for none
	}{
		{name: "chat", kind: renderChat, body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{name: "chat without model", kind: renderChat, body: `{"messages":[{"role":"user","content":"hi"}]}`},
		{name: "chat without messages", kind: renderChat, body: `{"model":"m"}`, code: "invalid_messages"},
		{name: "chat with an image", kind: renderChat, code: "unsupported_content",
			body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}]}]}`},
		{name: "text prompt", kind: renderCompletions, body: `{"model":"m","prompt":"hello"}`, prompts: 1},
		{name: "token ids", kind: renderCompletions, body: `{"prompt":[1,2,3]}`, prompts: 1, ids: true},
		{name: "two texts", kind: renderCompletions, body: `{"prompt":["a","b"]}`, prompts: 2},
		{name: "two id lists", kind: renderCompletions, body: `{"prompt":[[1],[2,3]]}`, prompts: 2, ids: true},
		{name: "no prompt", kind: renderCompletions, body: `{"model":"m"}`, code: "invalid_prompt"},
		{name: "empty prompt list", kind: renderCompletions, body: `{"prompt":[]}`, code: "invalid_prompt"},
		{name: "negative id", kind: renderCompletions, body: `{"prompt":[1,-2]}`, code: "invalid_prompt"},
		{name: "id past uint32", kind: renderCompletions, body: `{"prompt":[4294967296]}`, code: "invalid_prompt"},
		{name: "mixed list", kind: renderCompletions, body: `{"prompt":["a",{}]}`, code: "invalid_prompt"},
		{name: "prompt a number", kind: renderCompletions, body: `{"prompt":7}`, code: "invalid_prompt"},
		{name: "model a number", kind: renderCompletions, body: `{"model":7,"prompt":"x"}`, code: "invalid_model"},
		{name: "not JSON", kind: renderChat, body: `{"messages":`, code: "invalid_json"},
		{name: "not an object", kind: renderCompletions, body: `["x"]`, code: "invalid_json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, herr := decodeRenderRequest(tc.kind, []byte(tc.body))
			if tc.code != "" {
				if herr == nil || herr.Code != tc.code || herr.Status != http.StatusBadRequest {
					t.Fatalf("got %+v, %v; want a 400 %s", r, herr, tc.code)
				}
				return
			}
			if herr != nil {
				t.Fatalf("unexpected error %v", herr)
			}
			if tc.kind == renderCompletions && (len(r.prompts) != tc.prompts || r.prompts[0].IsIDs != tc.ids) {
				t.Fatalf("prompts %+v, want %d (ids %v)", r.prompts, tc.prompts, tc.ids)
			}
		})
	}
}

func FuzzDecodeRenderRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"prompt":[[1],[2,3]]}`, `{"prompt":["a","b"]}`, `{"prompt":"x"}`, `{"prompt":[1,-2]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"add_generation_prompt":false}`,
		`[]`, `{`, ``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, kind := range []renderKind{renderChat, renderCompletions} {
			r, herr := decodeRenderRequest(kind, []byte(body))
			if herr != nil {
				if herr.Status != http.StatusBadRequest || herr.Code == "" || !json.Valid(herr.Body()) {
					t.Fatalf("error %+v is not a 400 with an OpenAI body", herr)
				}
				continue
			}
			if kind == renderCompletions && len(r.prompts) == 0 {
				t.Fatal("a completions request decoded with no prompt")
			}
		}
	})
}

// startRender is a router with the Qwen3 tokenizer and its render listener.
func startRender(t *testing.T) (*Server, *tokenizer.Chat) {
	t.Helper()
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 1)
	cfg.RenderAddr = "127.0.0.1:0"
	r := start(t, cfg)
	chat, err := r.toks.Get(model)
	if err != nil {
		t.Fatal(err)
	}
	return r, chat
}

func postRender(t *testing.T, r *Server, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post("http://"+r.RenderAddr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func TestRenderServesTheRoutersTokens(t *testing.T) {
	r, chat := startRender(t)
	t.Run("chat: the ids of our chat template's output", func(t *testing.T) {
		req := tokenizer.ChatRequest{Messages: []tokenizer.Message{
			{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a prime."},
			{Role: "assistant", Content: "7"}, {Role: "user", Content: "Another."}}}
		body := `{"model":"` + model + `","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."},` +
			`{"role":"assistant","content":"7"},{"role":"user","content":"Another."}],"max_tokens":9}`
		status, got := postRender(t, r, RenderChatPath, body)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, got)
		}
		var out renderResponse
		if err := json.Unmarshal(got, &out); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		want, err := chat.EncodeChat(req)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out.TokenIDs, want) {
			t.Fatalf("token_ids %v, want %v", out.TokenIDs, want)
		}
		text, err := chat.ApplyChatTemplate(req)
		if err != nil {
			t.Fatal(err)
		}
		if dec := chat.Tokenizer().Decode(out.TokenIDs); dec != text {
			t.Fatalf("rendered prompt %q, the template gives %q", dec, text)
		}
	})
	t.Run("completions: one entry per prompt, special tokens added, ids passed through", func(t *testing.T) {
		status, got := postRender(t, r, RenderCompletionsPath, `{"model":"`+model+`","prompt":["Hello world.",[5,6,7]]}`)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, got)
		}
		var out []renderResponse
		if err := json.Unmarshal(got, &out); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		if len(out) != 2 || !slices.Equal(out[0].TokenIDs, chat.Tokenizer().Encode("Hello world.", true)) || !slices.Equal(out[1].TokenIDs, []uint32{5, 6, 7}) {
			t.Fatalf("got %s", got)
		}
	})
	t.Run("a body without model renders with the one tokenizer", func(t *testing.T) {
		status, got := postRender(t, r, RenderCompletionsPath, `{"prompt":""}`)
		if status != http.StatusOK || !bytes.Contains(got, []byte(`"token_ids":[]`)) {
			t.Fatalf("status %d: %s", status, got)
		}
	})
}

func TestRenderErrorsAreOpenAIBodies(t *testing.T) {
	r, _ := startRender(t)
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown model", http.MethodPost, RenderChatPath, `{"model":"other","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound, "model_not_found"},
		{"not JSON", http.MethodPost, RenderCompletionsPath, `{"prompt":`, http.StatusBadRequest, "invalid_json"},
		{"GET", http.MethodGet, RenderChatPath, ``, http.StatusMethodNotAllowed, "method_not_allowed"},
		{"another path", http.MethodPost, "/v1/chat/completions", `{}`, http.StatusNotFound, "not_found"},
		{"body too large", http.MethodPost, RenderCompletionsPath, `{"prompt":"` + strings.Repeat("a", maxRenderBody) + `"}`, http.StatusRequestEntityTooLarge, "body_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "http://"+r.RenderAddr()+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct{ Message, Type, Code string } `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("status %d, error %+v; want %d %s", resp.StatusCode, e.Error, tc.status, tc.code)
			}
		})
	}
}

func TestRenderListenerOffByDefault(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 1)
	r := start(t, cfg)
	if r.RenderAddr() != "" {
		t.Fatalf("render listener on %s without RenderAddr", r.RenderAddr())
	}
}
