package envoytest

import (
	"context"
	"github.com/kvroute/kvroute/envoy"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// gatewayGoroutines lists live goroutines running the Gateway's own code.
func gatewayGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range []string{"envoy.(*procStream)", "envoy.(*bodySender)", "envoy.(*Gateway)", "envoy.(*exchange)", "envoy.(*upstreamCall)"} {
			if strings.Contains(g, fn) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

func TestGatewayCloseLeavesNoGoroutines(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, router{decide: pickFromBody, clear: true}.script)
	src := readShipped(t, envoy.StyleClusterHeader)
	g, err := LoadGateway([]byte(src), GatewayOptions{ListenAddress: "127.0.0.1:0", Endpoints: f.endpoints(proc.addr)})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL()+"/v1/completions", strings.NewReader(`{"user":"w1"}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			if i%2 == 0 {
				cancel() // some clients leave early
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	http.DefaultClient.CloseIdleConnections()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		left := gatewayGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Gateway goroutines still running after Close:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func BenchmarkGatewayBufferedRequest(b *testing.B) {
	benchmarkGateway(b, envoy.StyleClusterHeader)
}

func BenchmarkGatewayFullDuplexRequest(b *testing.B) {
	benchmarkGateway(b, envoy.StyleOriginalDst)
}

// benchmarkGateway measures one short routed request end to end: client →
// Gateway → ext_proc round trips → worker → back, all over loopback.
func benchmarkGateway(b *testing.B, style string) {
	worker := startWorker(b, "w0")
	proc := startProcServer(b, router{decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
		return setHeaders(envoy.TargetHeader, "w0", envoy.DestinationHeader, hostOf(worker))
	}, clear: true}.script)
	eps := map[string][]string{envoy.ExtProcClusterName: {proc.addr}}
	if style == envoy.StyleClusterHeader {
		for _, w := range envoy.ExampleWorkers {
			eps[w.Cluster] = []string{hostOf(worker)}
		}
		eps[envoy.FallbackClusterName] = []string{hostOf(worker)}
	}
	g, err := LoadGateway([]byte(readShipped(b, style)), GatewayOptions{ListenAddress: "127.0.0.1:0", Endpoints: eps})
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(g.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	client.CloseIdleConnections()
	t0 := time.Now()
	_ = g.Close()
	if d := time.Since(t0); d > time.Second {
		b.Logf("Close took %v", d)
	}
}
