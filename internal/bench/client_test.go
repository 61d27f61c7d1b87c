package bench

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/sim"
)

// startWorker runs one real simulated vLLM worker (no NATS, no etcd).
func startWorker(t testing.TB) *sim.Worker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := sim.StartWorker(ctx, sim.WorkerConfig{
		ID: "w7", Model: DefaultModel, Speedup: 100,
		Engine: sim.EngineConfig{NumGPUBlocks: 1024, BlockSize: 16},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Close(context.Background())
		cancel()
	})
	return w
}

func TestClientMeasuresAKvsimCompletionStream(t *testing.T) {
	w := startWorker(t)
	c := NewClient(w.URL())
	defer c.Close()
	wl := TraceWorkload([]TraceRecord{{InputLength: 300, OutputLength: 12, HashIDs: []int64{5}}}, TraceOptions{Model: DefaultModel})
	it := &wl.Flows[0].Items[0]
	first := c.Do(context.Background(), it)
	if first.Err != nil {
		t.Fatal(first.Err)
	}
	if first.Worker != "w7" || first.PromptTokens != 300 || first.OutputTokens != 12 || len(first.ITL) != 11 {
		t.Errorf("got worker %q, %d prompt, %d output tokens, %d gaps; want w7, 300, 12, 11",
			first.Worker, first.PromptTokens, first.OutputTokens, len(first.ITL))
	}
	if first.TTFT <= 0 || first.E2E < first.TTFT || first.CachedTokens != 0 {
		t.Errorf("TTFT %v, E2E %v, cached %d", first.TTFT, first.E2E, first.CachedTokens)
	}
	again := c.Do(context.Background(), it)
	if again.Err != nil || again.CachedTokens != 288 {
		t.Errorf("repeat: err %v, cached %d, want 288 (all full blocks but the last token's)", again.Err, again.CachedTokens)
	}
}

func TestClientCountsOnlyContentChunksOfAChatStream(t *testing.T) {
	w := startWorker(t)
	c := NewClient(w.URL())
	defer c.Close()
	body, err := chatBody(DefaultModel, []chatMessage{{Role: "user", Content: "hello there"}}, 5)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Do(context.Background(), &Item{Path: PathChat, Body: body, OutputLen: 5})
	if r.Err != nil || r.OutputTokens != 5 || r.Worker != "w7" || r.PromptTokens == 0 {
		t.Errorf("err %v, %d tokens (the role chunk must not count), worker %q, %d prompt tokens", r.Err, r.OutputTokens, r.Worker, r.PromptTokens)
	}
}

func TestClientReportsHTTPErrors(t *testing.T) {
	w := startWorker(t)
	c := NewClient(w.URL())
	defer c.Close()
	// 1024 blocks of 16 tokens: a 20k-token prompt exceeds the context.
	wl := TraceWorkload([]TraceRecord{{InputLength: 20000, OutputLength: 1, HashIDs: make([]int64, 40)}}, TraceOptions{Model: DefaultModel})
	r := c.Do(context.Background(), &wl.Flows[0].Items[0])
	if r.Err == nil || r.Status != 400 || !strings.Contains(r.Err.Error(), "context length") {
		t.Errorf("status %d, err %v; want 400 naming the context length", r.Status, r.Err)
	}
}

func TestReadStreamEdgeCases(t *testing.T) {
	long := strings.Repeat("x", 40<<10)
	for _, tc := range []struct {
		name, body string
		tokens     int
		cached     int
		wantErr    string
	}{
		{"completion", "data: {\"id\":\"cmpl-w1-1\",\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n", 1, 4, ""},
		{"role chunk is not a token", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: [DONE]\n\n", 0, 0, ""},
		{"chunk longer than the buffer", "data: {\"choices\":[{\"text\":\"" + long + "\"}]}\n\ndata: [DONE]\n\n", 1, 0, ""},
		{"comments and blank lines", ": keepalive\n\nevent: x\ndata: [DONE]\n", 0, 0, ""},
		{"no done", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", 1, 0, "without [DONE]"},
		{"error event", "data: {\"error\":{\"message\":\"worker stopped\"}}\n\n", 0, 0, "worker stopped"},
		{"bad usage", "data: {\"usage\":{\"prompt_tokens\":\"x\"}}\n\n", 0, 0, "usage chunk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Result
			err := readStream(strings.NewReader(tc.body), &r, 4)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if r.OutputTokens != tc.tokens || r.CachedTokens != tc.cached {
				t.Errorf("%d tokens, %d cached; want %d, %d", r.OutputTokens, r.CachedTokens, tc.tokens, tc.cached)
			}
		})
	}
}

func TestWorkerFromID(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"cmpl-w0-12"}`:            "w0",
		`{"id":"chatcmpl-gpu-a-3"}`:      "gpu-a",
		`{"id":"cmpl-7"}`:                "",
		`{"object":"x"}`:                 "",
		`{"id":"chatcmpl-w1-1","x":"y"}`: "w1",
	} {
		if got := workerFromID([]byte(in)); got != want {
			t.Errorf("workerFromID(%s) = %q, want %q", in, got, want)
		}
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"id\":\"cmpl-w1-1\",\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n")
	f.Add("data: {\"error\":{}}\n")
	f.Add("data: \"text\":\"")
	f.Fuzz(func(t *testing.T, body string) {
		var r Result
		_ = readStream(strings.NewReader(body), &r, 0)
		if r.OutputTokens < 0 || len(r.ITL) > r.OutputTokens {
			t.Fatalf("%d tokens with %d gaps", r.OutputTokens, len(r.ITL))
		}
	})
}
