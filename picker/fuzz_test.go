package picker

import "testing"

func FuzzParseOpenAI(f *testing.F) {
	f.Add("/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add("/v1/completions", []byte(`{"model":"m","prompt":[[1,2,3],[4]],"max_tokens":5,"nvext":{"agent_hints":{"priority":2}}}`))
	f.Add("/v1/completions", []byte(`{"model":"m","prompt":[-1, 99999999999]}`))
	f.Add("/v1/chat/completions", []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"tools":[{"type":"function"}]}`))
	f.Add("/x", []byte(`[1,2`))
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		r, err := parseOpenAI(apiOf(path), body)
		if err != nil {
			return
		}
		if r.maxTokens < 0 || r.priority < 0 {
			t.Fatalf("negative values from %q: %+v", body, r)
		}
		if r.hasIDs && !r.hasPrompt {
			t.Fatal("ids without a prompt")
		}
	})
}
