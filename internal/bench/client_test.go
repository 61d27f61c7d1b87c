package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

// startWorker runs one real simulated vLLM worker (no NATS, no etcd).
func startWorker(t testing.TB) *sim.Worker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := sim.StartWorker(ctx, sim.WorkerConfig{
		ID: "w7", Model: DefaultModel, Speedup: 100,
		Engine: sim.EngineConfig{NumGPUBlocks: 1024, BlockSize: 16},
		Logger: slog.New(slog.DiscardHandler),
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
	// The worker is on this host: it wrote the first token after the
	// request left and before the client read it.
	if got := first.Start.Add(first.TTFT); first.FirstEmit.Before(first.Start) || first.FirstEmit.After(got) {
		t.Errorf("first token emitted at %v, want within [%v, %v]", first.FirstEmit, first.Start, got)
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
		if got := WorkerFromID([]byte(in)); got != want {
			t.Errorf("WorkerFromID(%s) = %q, want %q", in, got, want)
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

// sseServer answers every request with body in one Write, as a worker or a
// proxy that coalesces events does.
func sseServer(t *testing.T, header http.Header, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		for k, v := range header {
			rw.Header()[k] = v
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(rw, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// tokenEvents renders n completion chunks, stamped step apart when step > 0.
func tokenEvents(n int, step time.Duration) string {
	var b strings.Builder
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := range n {
		stamp := ""
		if step > 0 {
			stamp = fmt.Sprintf(`,"kvsim_t":%d`, t0+int64(i)*int64(step))
		}
		fmt.Fprintf(&b, "data: {\"id\":\"cmpl-w3-1\",\"choices\":[{\"text\":\"t\"}]%s}\n\n", stamp)
	}
	b.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"prompt_tokens_details\":{\"cached_tokens\":48}},\"kvroute_predicted_cached_tokens\":48}\n\ndata: [DONE]\n\n")
	return b.String()
}

func TestITLComesFromTheWorkersStampsWhenEventsArriveTogether(t *testing.T) {
	for _, tc := range []struct {
		name     string
		step     time.Duration
		min, max float64 // ITL p50 bounds, ms
	}{
		// All 20 events reach the client in one read: only the stamps
		// can tell them apart.
		{"stamped 10 ms apart", 10 * time.Millisecond, 9.99, 10.01},
		// Without stamps each event gets its own parse time, which is
		// what the client saw: nearly simultaneous.
		{"unstamped", 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := sseServer(t, nil, tokenEvents(20, tc.step))
			c := NewClient(srv.URL)
			defer c.Close()
			r := c.Do(context.Background(), &Item{Path: PathCompletions, Body: []byte(`{}`), OutputLen: 20})
			if r.Err != nil || r.OutputTokens != 20 || len(r.ITL) != 19 || r.Worker != "w3" {
				t.Fatalf("err %v, %d tokens, %d gaps, worker %q", r.Err, r.OutputTokens, len(r.ITL), r.Worker)
			}
			m := Measure([]Result{r}, time.Second)
			if m.ITL.P50 < tc.min || m.ITL.P50 > tc.max {
				t.Errorf("ITL p50 %.3f ms, want within [%g, %g]", m.ITL.P50, tc.min, tc.max)
			}
		})
	}
}

func TestClientReadsThePredictionFromHeaderOrUsageChunk(t *testing.T) {
	hdr := http.Header{}
	hdr.Set(sim.PredictedCachedTokensHeader, "32")
	body := tokenEvents(2, time.Millisecond)
	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
		want   int // -1: no prediction
	}{
		{"usage chunk wins over the header", hdr, body, 48},
		{"header only", hdr, strings.Replace(body, `,"kvroute_predicted_cached_tokens":48`, "", 1), 32},
		{"none", nil, strings.Replace(body, `,"kvroute_predicted_cached_tokens":48`, "", 1), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClient(sseServer(t, tc.header, tc.body).URL)
			defer c.Close()
			r := c.Do(context.Background(), &Item{Path: PathCompletions, Body: []byte(`{}`)})
			got := -1
			if r.PredictedCached != nil {
				got = *r.PredictedCached
			}
			if r.Err != nil || got != tc.want || r.CachedTokens != 48 {
				t.Errorf("err %v, predicted %d, cached %d; want predicted %d, cached 48", r.Err, got, r.CachedTokens, tc.want)
			}
		})
	}
}

func TestKvsimStampsEveryTokenChunk(t *testing.T) {
	w := startWorker(t)
	body := completionBody(DefaultModel, BlockTokens(nil, 3, 64), 6)
	req, err := http.NewRequest(http.MethodPost, w.URL()+PathCompletions, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(sim.PredictedCachedTokensHeader, "17")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get(sim.PredictedCachedTokensHeader); got != "17" {
		t.Errorf("response header %q, want the request's 17 echoed", got)
	}
	var prev int64
	tokens := 0
	for _, line := range strings.Split(string(raw), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !hasToken([]byte(data)) {
			continue
		}
		tokens++
		st := emitStamp([]byte(data))
		if st <= 0 || st < prev {
			t.Errorf("token %d stamp %d after %d: want increasing Unix nanos", tokens, st, prev)
		}
		prev = st
	}
	if tokens != 6 || !strings.Contains(string(raw), `"kvroute_predicted_cached_tokens":17`) {
		t.Errorf("%d tokens (want 6); usage chunk carries the prediction: %v", tokens, strings.Contains(string(raw), "kvroute_predicted"))
	}
}
