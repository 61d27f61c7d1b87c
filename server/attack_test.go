package server

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// attackBody is a hostile body: a chat of n one-character
// messages (~30 bytes each).
func attackBody(n int) []byte {
	var b strings.Builder
	b.Grow(30 * n)
	fmt.Fprintf(&b, `{"model":%q,"messages":[`, model)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"x"}`)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// sendBuffered sends one BUFFERED request with body and returns the
// immediate status (0 when routed) or the stream error.
func sendBuffered(ctx context.Context, cc *grpc.ClientConn, body []byte) (int, error) {
	st, err := pb.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		return 0, err
	}
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
	}}
	pc := &pb.ProtocolConfiguration{RequestBodyMode: extprocmode.ProcessingMode_BUFFERED}
	if err := st.Send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestHeaders{RequestHeaders: &pb.HttpHeaders{Headers: hdrs}}, ProtocolConfig: pc}); err != nil {
		return 0, err
	}
	if _, err := st.Recv(); err != nil {
		return 0, err
	}
	if err := st.Send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestBody{RequestBody: &pb.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return 0, err
	}
	resp, err := st.Recv()
	if err != nil {
		return 0, err
	}
	_ = st.CloseSend()
	if ir := resp.GetImmediateResponse(); ir != nil {
		return int(ir.GetStatus().GetCode()), nil
	}
	return 0, nil
}

// heapPeaks samples the heap until stop is closed and returns the peaks
// of HeapInuse (live and not yet collected) and of the live heap the
// last GC marked.
func heapPeaks(stop <-chan struct{}) <-chan [2]uint64 {
	out := make(chan [2]uint64, 1)
	go func() {
		var peak [2]uint64
		var ms runtime.MemStats
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			metrics.Read(live)
			peak[0] = max(peak[0], ms.HeapInuse)
			peak[1] = max(peak[1], live[0].Value.Uint64())
			select {
			case <-stop:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return out
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A memory attack: six concurrent 9 MB chat bodies of 300k
// one-character messages. With the caps (messages, decision slots) every
// request is answered, routed by load or shed with 429, and the heap
// stays under a ceiling derived from the caps. What can be live at once:
//
//	per request in flight (N): the gRPC message and the stream's copy of
//	the body (2 × B), plus the test client's encoded copy (1 × B);
//	per decision slot (D): the parsed JSON tree, measured at 8.75 × B for
//	this body (tokenizer.DecodeJSON); the message cap stops it there,
//	before the chat is converted, rendered or tokenized;
//	so live ≤ L = N × 3 × B + D × 9 × B.
//
// The live heap the GC marks must stay under L + 64 MiB, and the heap in
// use (live plus garbage not yet collected) under 2 × L, the most GOGC=100
// lets it reach. With N = 6, D = 4 and B = 9 MB, L ≈ 486 MB (without the caps
// the same bodies reached 4 GB RSS, the pod's limit).
func TestMemoryAttackStaysUnderCeiling(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 54 MB of JSON")
	}
	const (
		clients  = 6
		messages = 300_000
		slots    = 4
	)
	body := attackBody(messages)
	B := uint64(len(body))
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 2)
	cfg.MaxConcurrentDecisions = slots
	r := start(t, cfg)
	eventually(t, "ready", r.Ready)
	cc := dial(t, r)
	L := clients*3*B + slots*9*B

	base := heapInuse()
	stop := make(chan struct{})
	peakC := heapPeaks(stop)
	var wg sync.WaitGroup
	var routed, shed atomic.Int64
	errs := make(chan error, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			status, err := sendBuffered(ctx, cc, body)
			switch {
			case err != nil:
				errs <- err
			case status == 0:
				routed.Add(1)
			case status == 429:
				shed.Add(1)
			default:
				errs <- fmt.Errorf("status %d", status)
			}
		}()
	}
	wg.Wait()
	close(stop)
	peaks := <-peakC
	close(errs)
	for err := range errs {
		t.Errorf("attack request: %v", err)
	}
	inuse, live := peaks[0]-min(peaks[0], base), peaks[1]-min(peaks[1], base)
	t.Logf("body %.1f MB × %d, %d decision slots: heap in use %.0f MB before; peak +%.0f MB in use (ceiling 2L = %.0f MB), +%.0f MB live (ceiling L + 64 MiB = %.0f MB); routed by load %d, shed %d",
		float64(B)/1e6, clients, slots, float64(base)/1e6, float64(inuse)/1e6, 2*float64(L)/1e6, float64(live)/1e6, float64(L+64<<20)/1e6, routed.Load(), shed.Load())
	if inuse > 2*L {
		t.Errorf("heap in use grew %d MB under the attack, over the 2L = %d MB ceiling", inuse>>20, 2*L>>20)
	}
	if live > L+64<<20 {
		t.Errorf("live heap grew %d MB under the attack, over the L + 64 MiB = %d MB ceiling", live>>20, (L+64<<20)>>20)
	}
	if routed.Load()+shed.Load() != clients {
		t.Errorf("%d routed + %d shed of %d", routed.Load(), shed.Load(), clients)
	}
	text := get(t, "http://"+r.HTTPAddr()+"/metrics", 200)
	if !strings.Contains(text, `kvroute_routed_by_load_total{model="Qwen/Qwen3-8B",reason="too_many_messages"} `+fmt.Sprint(routed.Load())) {
		t.Errorf("metrics do not count %d too_many_messages:\n%s", routed.Load(), grepLines(text, "routed_by_load"))
	}
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metricValue reads one sample from /metrics ("" labels: the bare name).
func metricValue(t *testing.T, r *Server, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(get(t, "http://"+r.HTTPAddr()+"/metrics", 200), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// A client that gives up stops the router's work on its request: with
// the caps off, a 250k-message chat takes the decision many seconds to
// render and tokenize; cancelled just after it is sent, the decision ends
// as "cancelled" (it would be "routed" had it run to the end), and the
// stream closes.
func TestCancelledRequestStopsItsDecision(t *testing.T) {
	if testing.Short() {
		t.Skip("sends a 14 MB chat")
	}
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"messages":[`, model)
	for i := range 250_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":"user","content":"message %d about things"}`, i)
	}
	b.WriteString(`]}`)
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 2)
	cfg.MaxMessages, cfg.MaxPromptBytes, cfg.MaxConcurrentDecisions = 0, 0, 0 // the work the caps would refuse
	r := start(t, cfg)
	eventually(t, "ready", r.Ready)
	cc := dial(t, r)

	ctx, cancel := context.WithCancel(context.Background())
	st, err := pb.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
	}}
	pc := &pb.ProtocolConfiguration{RequestBodyMode: extprocmode.ProcessingMode_BUFFERED}
	if err := st.Send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestHeaders{RequestHeaders: &pb.HttpHeaders{Headers: hdrs}}, ProtocolConfig: pc}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestBody{RequestBody: &pb.HttpBody{Body: []byte(b.String()), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	// Wait until the router holds the stream's body in a decision.
	eventually(t, "the decision to start", func() bool {
		return metricValue(t, r, `kvroute_decision_duration_seconds_count{phase="parse"}`) == 1
	})
	cancelled := time.Now()
	cancel()
	const series = `kvroute_requests_total{mode="kv",model="Qwen/Qwen3-8B",outcome="cancelled",worker=""}`
	deadline := time.Now().Add(30 * time.Second)
	for metricValue(t, r, series) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no cancelled decision 30 s after the client cancelled:\n%s", grepLines(get(t, "http://"+r.HTTPAddr()+"/metrics", 200), "kvroute_requests_total"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("decision ended %v after the client cancelled", time.Since(cancelled).Round(time.Millisecond))
	eventually(t, "the stream to close", func() bool { return metricValue(t, r, "kvroute_extproc_streams_active") == 0 })
}
