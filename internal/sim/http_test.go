package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files")

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func startTestWorker(t *testing.T, cfg WorkerConfig) *Worker {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID = "w0"
	}
	if cfg.Model == "" {
		cfg.Model = "test-model"
	}
	if cfg.Engine.NumGPUBlocks == 0 {
		cfg.Engine = EngineConfig{NumGPUBlocks: 256, BlockSize: 16}
	}
	if cfg.Speedup == 0 {
		cfg.Speedup = 1000
	}
	cfg.Logger = quietLogger()
	w, err := StartWorker(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w.Close(ctx)
	})
	return w
}

func post(t *testing.T, url string, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

func idsJSON(start, n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strings.TrimSpace(string(mustJSON(start + i))))
	}
	b.WriteByte(']')
	return b.String()
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func TestCompletionsReportCachedTokensOfReusedBlocks(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{})
	tests := []struct {
		name       string
		prompt     string
		wantPrompt int
		wantCached int
	}{
		{"cold prompt", idsJSON(0, 100), 100, 0},
		{"same prompt reuses its 6 full blocks", idsJSON(0, 100), 100, 96},
		{"longer prompt with the same prefix", idsJSON(0, 130), 130, 96},
		{"text prompt is tokenized", `"hello world"`, 11, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, data := post(t, w.URL()+"/v1/completions",
				`{"model":"test-model","prompt":`+tt.prompt+`,"max_tokens":5,"ignore_eos":true}`)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			var got completionResponse
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if got.Object != "text_completion" || len(got.Choices) != 1 || *got.Choices[0].FinishReason != "length" {
				t.Fatalf("response %s", data)
			}
			u := got.Usage
			if u.PromptTokens != tt.wantPrompt || u.CompletionTokens != 5 || u.TotalTokens != tt.wantPrompt+5 ||
				u.PromptTokensDetails.CachedTokens != tt.wantCached {
				t.Fatalf("usage %+v cached %d, want prompt %d cached %d", u, u.PromptTokensDetails.CachedTokens, tt.wantPrompt, tt.wantCached)
			}
			if n := len(strings.Fields(got.Choices[0].Text)); n != 5 {
				t.Fatalf("text %q has %d words, want 5", got.Choices[0].Text, n)
			}
		})
	}
}

// normalizeSSE replaces the fields that change between runs.
func normalizeSSE(b []byte) []byte {
	b = regexp.MustCompile(`"created":\d+`).ReplaceAll(b, []byte(`"created":0`))
	b = regexp.MustCompile(`"kvsim_t":\d+`).ReplaceAll(b, []byte(`"kvsim_t":1`))
	return regexp.MustCompile(`"id":"(chat)?cmpl-[^"]*"`).ReplaceAll(b, []byte(`"id":"${1}cmpl-X"`))
}

func TestStreamingSSEFormat(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{})
	tests := []struct {
		name, path, body, golden string
	}{
		{"completions", "/v1/completions", `{"prompt":` + idsJSON(7, 40) + `,"max_tokens":3,"stream":true}`, "sse_completions.golden"},
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`, "sse_chat.golden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, data := post(t, w.URL()+tt.path, tt.body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			// Every event is "data: ...\n\n" and the stream ends with [DONE].
			events := strings.Split(strings.TrimSuffix(string(data), "\n\n"), "\n\n")
			for _, ev := range events {
				if !strings.HasPrefix(ev, "data: ") || strings.Contains(ev, "\n") {
					t.Fatalf("malformed SSE event %q", ev)
				}
			}
			if events[len(events)-1] != "data: [DONE]" {
				t.Fatalf("last event %q", events[len(events)-1])
			}
			var last struct {
				Choices []any  `json:"choices"`
				Usage   *usage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(events[len(events)-2], "data: ")), &last); err != nil {
				t.Fatal(err)
			}
			if last.Usage == nil || last.Usage.CompletionTokens != 3 || len(last.Choices) != 0 {
				t.Fatalf("usage chunk %+v", last)
			}
			got := normalizeSSE(data)
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("SSE stream differs from %s:\n%s", path, got)
			}
		})
	}
}

func TestNonStreamingChat(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{})
	resp, data := post(t, w.URL()+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hello"}],"max_completion_tokens":4}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	var got chatResponse
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if got.Object != "chat.completion" || got.Choices[0].Message.Role != "assistant" || got.Usage.CompletionTokens != 4 {
		t.Fatalf("response %s", data)
	}
	// "user: hello\nassistant: " byte-encoded.
	if got.Usage.PromptTokens != len("user: hello\nassistant: ") {
		t.Fatalf("prompt tokens %d", got.Usage.PromptTokens)
	}
}

func TestRequestErrors(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{})
	tests := []struct {
		name, path, body string
		want             int
	}{
		{"not JSON", "/v1/completions", `{`, 400},
		{"unknown model", "/v1/completions", `{"model":"other","prompt":"x"}`, 404},
		{"no prompt", "/v1/completions", `{"max_tokens":1}`, 400},
		{"negative token id", "/v1/completions", `{"prompt":[1,-2]}`, 400},
		{"batched prompts", "/v1/completions", `{"prompt":["a","b"]}`, 400},
		{"zero max_tokens", "/v1/completions", `{"prompt":"a","max_tokens":0}`, 400},
		{"longer than the KV cache", "/v1/completions", `{"prompt":"a","max_tokens":5000}`, 400},
		{"chat without messages", "/v1/chat/completions", `{"max_tokens":1}`, 400},
		{"several choices", "/v1/completions", `{"prompt":"a","n":2}`, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, data := post(t, w.URL()+tt.path, tt.body)
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, data)
			}
			var e apiError
			if err := json.Unmarshal(data, &e); err != nil || e.Error.Message == "" || e.Error.Code != tt.want {
				t.Fatalf("error body %s", data)
			}
		})
	}
}

func TestModelsHealthAndMetrics(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{})
	post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(0, 64)+`,"max_tokens":3}`)
	post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(0, 64)+`,"max_tokens":3}`)
	get := func(path string) string {
		resp, err := http.Get(w.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	get("/health")
	if models := get("/v1/models"); !strings.Contains(models, `"id":"test-model"`) {
		t.Fatalf("models %s", models)
	}
	metrics := get("/metrics")
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="test-model"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="test-model"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="test-model"} 0`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="test-model"} 128`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="test-model"} 48`,
		`vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="256"} 1`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="test-model"} 2`,
		`vllm:inter_token_latency_seconds_count{engine="0",model_name="test-model"} 4`,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="test-model"} 2`,
		`kvsim_clock_lag_seconds_total{engine="0",model_name="test-model",worker="w0"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestClientDisconnectAbortsAndFreesBlocks(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{Speedup: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", w.URL()+"/v1/completions",
		strings.NewReader(`{"prompt":`+idsJSON(0, 200)+`,"max_tokens":3000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read the first token, then hang up.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q err %v", line, err)
	}
	if st := w.Stats(); st.Running != 1 || st.UsedBlocks == 0 {
		t.Fatalf("while streaming: %+v", st)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for w.Stats().Running != 0 || w.Stats().UsedBlocks != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("request not aborted: %+v", w.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestIgnoreEOSDecidesWhetherOutputsStopEarly(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{EOSProbability: 0.2})
	prompt := idsJSON(0, 40)
	tests := []struct {
		name       string
		ignoreEOS  bool
		wantReason string
	}{
		{"without ignore_eos a simulated EOS stops early", false, "stop"},
		{"ignore_eos runs to max_tokens", true, "length"},
	}
	var lengths []int
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"prompt":` + prompt + `,"max_tokens":200,"ignore_eos":` + strconv.FormatBool(tt.ignoreEOS) + `}`
			_, data := post(t, w.URL()+"/v1/completions", body)
			var got completionResponse
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if r := *got.Choices[0].FinishReason; r != tt.wantReason {
				t.Fatalf("finish_reason %q, want %q", r, tt.wantReason)
			}
			lengths = append(lengths, got.Usage.CompletionTokens)
			// The same prompt stops at the same place every time.
			_, again := post(t, w.URL()+"/v1/completions", body)
			if err := json.Unmarshal(again, &got); err != nil || got.Usage.CompletionTokens != lengths[len(lengths)-1] {
				t.Fatalf("second run: %s", again)
			}
		})
	}
	if len(lengths) != 2 || lengths[0] >= 200 || lengths[1] != 200 {
		t.Fatalf("completion lengths %v, want <200 then 200", lengths)
	}
}

// A streamed chat starts like vLLM's: the headers at once, and the first
// event (the role) only with the first token, so a proxy that times the
// first token at the first body byte sees the prefill.
func TestStreamedChatSendsItsFirstEventWithTheFirstToken(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{Speedup: 1, Engine: EngineConfig{NumGPUBlocks: 512, BlockSize: 16}})
	resp, err := http.Post(w.URL()+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"messages":[{"role":"user","content":"`+strings.Repeat("tell me more about the cache ", 60)+`"}],"max_tokens":2,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	n, err := resp.Body.Read(buf)
	if n == 0 {
		t.Fatalf("first read: %v", err)
	}
	first := string(buf[:n])
	if !strings.Contains(first, `"role":"assistant"`) || !strings.Contains(first, `"kvsim_t"`) {
		t.Fatalf("first body read %q: want the role event and the first token together", first)
	}
}
