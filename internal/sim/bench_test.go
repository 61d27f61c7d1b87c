package sim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchPrompt returns request i's prompt: a shared system prefix, a
// per-conversation prefix and a fresh tail, like a chat trace.
func benchPrompt(i, n int) []int32 {
	p := make([]int32, n)
	for j := range p {
		switch {
		case j < n/4:
			p[j] = int32(1000 + j)
		case j < n*3/4:
			p[j] = int32(100000 + (i%32)*n + j)
		default:
			p[j] = int32(5000000 + i*n + j)
		}
	}
	return p
}

// BenchmarkEngineRequest measures the engine's CPU per request with default
// engine sizes and 64 requests in flight: chat-like requests (1,024-token
// prompts, 128 output tokens) and Mooncake-trace-like ones (12,000-token
// prompts, 343 output tokens, the conversation trace's means); a quarter of
// each prompt is a shared prefix and half a per-conversation one.
func BenchmarkEngineRequest(b *testing.B) {
	for _, c := range []struct {
		name           string
		prompt, output int
	}{{"chat", 1024, 128}, {"mooncake", 12000, 343}} {
		b.Run(c.name, func(b *testing.B) { benchEngine(b, c.prompt, c.output) })
	}
}

func benchEngine(b *testing.B, promptLen, outputLen int) {
	e, err := NewEngine(EngineConfig{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	prompts := make([][]int32, 64)
	for i := range prompts {
		prompts[i] = benchPrompt(i, promptLen)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	next, done := 0, 0
	for done < b.N {
		for next < b.N && next-done < 64 {
			if err := e.Add(uint64(next), prompts[next%len(prompts)], outputLen); err != nil {
				b.Fatal(err)
			}
			next++
		}
		for _, o := range e.Step().Outputs {
			if o.Finished {
				done++
			}
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/req")
}

// BenchmarkFleetGenerate runs 8 workers at speedups of 100 and 10^6, publishing
// KV events and load reports to an embedded NATS server, and drives them
// in-process (no HTTP, no tokenization) with 32 concurrent clients per
// worker: simulated requests per second and CPU per request, NATS server
// included.
func BenchmarkFleetGenerate(b *testing.B) {
	for _, speedup := range []float64{100, 1e6} {
		b.Run(fmt.Sprintf("speedup=%g", speedup), func(b *testing.B) { benchFleetGenerate(b, speedup) })
	}
}

func benchFleetGenerate(b *testing.B, speedup float64) {
	ns := testenv.StartNATS(b)
	f, err := StartFleet(context.Background(), FleetConfig{Workers: 8, NATSURL: ns.URL, Worker: WorkerConfig{
		Model: "bench", Speedup: speedup, Logger: quietLogger(),
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		b.StopTimer()
		f.Close(context.Background())
	}()
	prompts := make([][]int32, 256)
	for i := range prompts {
		prompts[i] = benchPrompt(i, 1024)
	}
	var n atomic.Int64
	b.ResetTimer()
	cpu0 := cpuTime()
	var wg sync.WaitGroup
	for c := range 8 * 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := f.Workers()[c%8]
			for {
				i := n.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if _, err := w.Generate(context.Background(), prompts[i%int64(len(prompts))], 128); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
	var steps uint64
	for _, w := range f.Workers() {
		steps += w.Stats().Steps
	}
	b.ReportMetric(float64(steps)/float64(b.N), "steps/req")
}

// BenchmarkFleetHTTP is BenchmarkFleetGenerate through the OpenAI HTTP API
// (non-streaming completions with token-id prompts): the cost a load
// generator sees, HTTP and JSON included.
func BenchmarkFleetHTTP(b *testing.B) {
	f, err := StartFleet(context.Background(), FleetConfig{Workers: 8, Worker: WorkerConfig{
		Model: "bench", Speedup: 1e6, Logger: quietLogger(),
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		b.StopTimer()
		f.Close(context.Background())
	}()
	bodies := make([]string, 64)
	for i := range bodies {
		var sb strings.Builder
		sb.WriteString(`{"prompt":[`)
		for j, t := range benchPrompt(i, 1024) {
			if j > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprint(&sb, t)
		}
		sb.WriteString(`],"max_tokens":128}`)
		bodies[i] = sb.String()
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var n atomic.Int64
	b.ResetTimer()
	cpu0 := cpuTime()
	var wg sync.WaitGroup
	for c := range 8 * 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := f.Workers()[c%8].URL() + "/v1/completions"
			for {
				i := n.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				resp, err := client.Post(url, "application/json", strings.NewReader(bodies[i%int64(len(bodies))]))
				if err != nil {
					b.Error(err)
					return
				}
				var buf [4096]byte
				for {
					if _, err := resp.Body.Read(buf[:]); err != nil {
						break
					}
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
}

// BenchmarkBlockHash is the engine's hash of one 64-token block.
func BenchmarkBlockHash(b *testing.B) {
	toks := benchPrompt(1, 64)
	b.SetBytes(64 * 4)
	var h int64
	for b.Loop() {
		h = blockHash(h, toks)
	}
}
