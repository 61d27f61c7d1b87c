package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"
)

// sseStream renders a kvsim-shaped completion stream of n tokens.
func sseStream(n int) []byte {
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "data: {\"id\":\"cmpl-w3-17\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"Qwen/Qwen3-8B\",\"choices\":[{\"index\":0,\"text\":\" tok%d\",\"finish_reason\":null}]}\n\n", i)
	}
	b.WriteString("data: {\"id\":\"cmpl-w3-17\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"Qwen/Qwen3-8B\",\"choices\":[],\"usage\":{\"prompt_tokens\":4096,\"completion_tokens\":256,\"total_tokens\":4352,\"prompt_tokens_details\":{\"cached_tokens\":2048}}}\n\ndata: [DONE]\n\n")
	return b.Bytes()
}

// BenchmarkReadStream is the client's parsing cost for one 256-token
// streamed response.
func BenchmarkReadStream(b *testing.B) {
	stream := sseStream(256)
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		var r Result
		if err := readStream(bytes.NewReader(stream), &r, 256); err != nil || r.OutputTokens != 256 {
			b.Fatalf("%v, %d tokens", err, r.OutputTokens)
		}
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkClientLoopback drives a loopback server that answers every
// request with a canned 16-token stream, from 64 concurrent flows. The CPU
// per request includes the in-process server's, so it bounds the client's
// own cost from above; req/s is what one kvbench process can drive.
func BenchmarkClientLoopback(b *testing.B) {
	stream := sseStream(16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(stream)
	}))
	defer srv.Close()
	c := NewClient(srv.URL)
	defer c.Close()
	w := TraceWorkload([]TraceRecord{{InputLength: 512, OutputLength: 16, HashIDs: []int64{1}}}, TraceOptions{Model: DefaultModel})
	it := w.Flows[0].Items[0]
	b.ReportAllocs()
	b.SetParallelism(32)
	cpu0, t0 := cpuTime(), time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		item := it
		for pb.Next() {
			if r := c.Do(context.Background(), &item); r.Err != nil {
				b.Error(r.Err)
				return
			}
		}
	})
	b.StopTimer()
	cpu, wall := cpuTime()-cpu0, time.Since(t0)
	b.ReportMetric(float64(b.N)/wall.Seconds(), "req/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
}
