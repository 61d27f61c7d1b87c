package picker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
	"google.golang.org/grpc"
)

// timedDecider measures the in-router decision overhead (parse, tokenize,
// hash, match, pick) of every request.
type timedDecider struct {
	inner extproc.Decider
	mu    sync.Mutex
	durs  []time.Duration
}

func (d *timedDecider) Decide(ctx context.Context, r *extproc.Request) (extproc.Decision, error) {
	start := time.Now()
	dec, err := d.inner.Decide(ctx, r)
	el := time.Since(start)
	d.mu.Lock()
	d.durs = append(d.durs, el)
	d.mu.Unlock()
	if dec.Ticket != nil {
		// The benchmark has no response path; free at once so load stays flat.
		dec.Ticket.Free(extproc.OutcomeOK)
		dec.Ticket = nil
	}
	return dec, err
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// benchBodies builds the three workloads. Each call gives a new body whose
// shared prefix stays the same and whose tail differs, as agentic and
// multi-turn traffic does.
func benchBody(kind string, i int) (path string, body []byte) {
	switch kind {
	case "short_chat":
		return "/v1/chat/completions", fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"What is the capital of France? (%d)"}],"max_tokens":32}`, testModel, i)
	case "chat_8k":
		// About 8,000 tokens: a long shared system prompt and a unique question.
		sys := strings.Repeat("The router keeps a prefix index of KV blocks per worker. ", 690)
		return "/v1/chat/completions", fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"Question %d: which worker?"}],"stream":true}`, testModel, sys, i)
	case "completion_100k":
		doc := strings.Repeat("Routing overhead must stay small next to prefill. ", 10000)
		return "/v1/completions", fmt.Appendf(nil, `{"model":%q,"prompt":%q,"max_tokens":16}`, testModel, fmt.Sprintf("%s extproc.Request %d.", doc, i))
	}
	panic(kind)
}

// roundTrip drives one request through a real ext_proc stream in
// FULL_DUPLEX_STREAMED mode and waits for the route.
func roundTrip(b *testing.B, client pb.ExternalProcessorClient, path string, body []byte) {
	st, err := client.Process(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	h := headerMsg(extproc.ModeFullDuplex, extproc.ModeNone, false, hdr{":method", "POST"}, hdr{":path", path})
	if err := st.Send(h); err != nil {
		b.Fatal(err)
	}
	for off := 0; off < len(body) || off == 0; off += 64 << 10 {
		end := min(off+64<<10, len(body))
		m := &pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestBody{RequestBody: &pb.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}
		if err := st.Send(m); err != nil {
			b.Fatal(err)
		}
		if end == len(body) {
			break
		}
	}
	r, err := st.Recv()
	if err != nil {
		b.Fatal(err)
	}
	if !routed(r) {
		b.Fatalf("no route: %v", r)
	}
	for { // the echoed body chunks
		r, err = st.Recv()
		if err != nil {
			b.Fatal(err)
		}
		if r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	_ = st.CloseSend()
}

func benchRouter(b *testing.B, workload string) {
	rg := newRig(b, nil)
	td := &timedDecider{inner: rg.picker}
	_, cc := startServer(b, extproc.ServerConfig{Decider: td, Logger: discardLogger()})
	client := pb.NewExternalProcessorClient(cc)
	// Warm the tokenizer's prefix cache with the shared prefix, as steady
	// traffic would.
	path, body := benchBody(workload, -1)
	roundTrip(b, client, path, body)
	td.durs = td.durs[:0]
	bodies := make([][]byte, 64)
	for i := range bodies {
		_, bodies[i] = benchBody(workload, i)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(bodies[0])))
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	var next sync.Mutex
	i := 0
	b.RunParallel(func(pbb *testing.PB) {
		for pbb.Next() {
			next.Lock()
			body := bodies[i%len(bodies)]
			i++
			next.Unlock()
			roundTrip(b, client, path, body)
		}
	})
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	// CPU per request (router and the test's gRPC client together) is
	// stable on a busy machine; 2 cores ÷ it bounds the routed rate.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
	b.ReportMetric(float64(b.N)/el.Seconds(), "req/s")
	b.ReportMetric(float64(percentile(td.durs, 0.50).Microseconds()), "overhead-p50-µs")
	b.ReportMetric(float64(percentile(td.durs, 0.99).Microseconds()), "overhead-p99-µs")
}

func BenchmarkRouteShortChat(b *testing.B)      { benchRouter(b, "short_chat") }
func BenchmarkRouteChat8k(b *testing.B)         { benchRouter(b, "chat_8k") }
func BenchmarkRouteCompletion100k(b *testing.B) { benchRouter(b, "completion_100k") }

var _ = grpc.NewClient

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecideChat8k measures the decision alone (no gRPC), serially:
// parse, tokenize through the prefix cache, hash, match and pick.
func BenchmarkDecideChat8k(b *testing.B) {
	rg := newRig(b, nil)
	_, warm := benchBody("chat_8k", -1)
	if _, err := rg.picker.Decide(context.Background(), chatReq(string(warm))); err != nil {
		b.Fatal(err)
	}
	reqs := make([]*extproc.Request, 64)
	for i := range reqs {
		_, body := benchBody("chat_8k", i)
		reqs[i] = chatReq(string(body))
	}
	durs := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		d, err := rg.picker.Decide(context.Background(), reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(start))
		d.Ticket.Free(extproc.OutcomeOK)
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(durs, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(durs, 0.99).Microseconds()), "p99-µs")
}

// BenchmarkDecideChat8kExplained is BenchmarkDecideChat8k with every
// decision's explanation kept (the request log, --request-log-size).
func BenchmarkDecideChat8kExplained(b *testing.B) {
	rg := newRig(b, func(_ *scoring.Options, c *Config) { c.Explain = true })
	_, warm := benchBody("chat_8k", -1)
	if _, err := rg.picker.Decide(context.Background(), chatReq(string(warm))); err != nil {
		b.Fatal(err)
	}
	reqs := make([]*extproc.Request, 64)
	for i := range reqs {
		_, body := benchBody("chat_8k", i)
		reqs[i] = chatReq(string(body))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := rg.picker.Decide(context.Background(), reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		d.Ticket.Free(extproc.OutcomeOK)
	}
}

// BenchmarkDecideImageChat measures the decision for a chat with two
// images (data: URLs of about 48 KiB each) to a declared vision-language
// model with uuid injection: parse, image identity and size, render,
// expand, the body rewritten with each image's uuid, hash, match, pick.
func BenchmarkDecideImageChat(b *testing.B) {
	rg := vlRig(b, true)
	reqs := make([]*extproc.Request, 16)
	for i := range reqs {
		body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 64, "messages": []any{
			map[string]any{"role": "system", "content": strings.Repeat("You describe pictures for a catalogue. ", 40)},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "text", "text": fmt.Sprintf("Compare these two pictures (%d).", i)},
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": pngURL(640, 480, strings.Repeat("a", 36<<10)+fmt.Sprint(i))}},
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": pngURL(448, 448, strings.Repeat("b", 36<<10)+fmt.Sprint(i))}},
			}},
		}})
		reqs[i] = chatReq(string(body))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := rg.picker.Decide(context.Background(), reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		if d.Body == nil {
			b.Fatal("body not rewritten")
		}
		d.Ticket.Free(extproc.OutcomeOK)
	}
}
