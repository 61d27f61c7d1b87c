package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

const model = "Qwen/Qwen3-8B"

var qwenDir = "../tokenizer/testdata/qwen3"

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func workersFile(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("workers:\n")
	for i := range n {
		fmt.Fprintf(&b, "- {id: w%d, model: %q, address: '10.0.0.%d:8000', block_size: 16, kv_total_blocks: 4096, max_num_batched_tokens: 8192}\n", i, model, i+1)
	}
	p := filepath.Join(t.TempDir(), "workers.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// testConfig is a router on free loopback ports with the Qwen3 tokenizer.
func testConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr, cfg.EmbeddedNATSAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Tokenizers = map[string]tokenizer.ModelSource{model: {Dir: qwenDir}}
	cfg.Logger = quiet()
	cfg.ShutdownGrace = time.Second
	return cfg
}

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := r.Wait(); err != nil {
			t.Errorf("router ended with %v", err)
		}
	})
	return r
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dial(t *testing.T, r *Server) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// sendChat opens a stream and sends one chat request's headers and body
// in FULL_DUPLEX_STREAMED mode, as Envoy does; cancel ends the stream.
func sendChat(t *testing.T, cc *grpc.ClientConn, body string) (st pb.ExternalProcessor_ProcessClient, cancel context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := pb.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
	}}
	for _, m := range []*pb.ProcessingRequest{
		{Request: &pb.ProcessingRequest_RequestHeaders{RequestHeaders: &pb.HttpHeaders{Headers: hdrs}},
			ProtocolConfig: &pb.ProtocolConfiguration{RequestBodyMode: extprocmode.ProcessingMode_FULL_DUPLEX_STREAMED}},
		{Request: &pb.ProcessingRequest_RequestBody{RequestBody: &pb.HttpBody{Body: []byte(body), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	return st, cancel
}

// route sends one chat request and returns the target header (or the
// immediate status).
func route(t *testing.T, cc *grpc.ClientConn, body string) (worker string, status int) {
	t.Helper()
	st, cancel := sendChat(t, cc, body)
	defer cancel()
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	if ir := resp.GetImmediateResponse(); ir != nil {
		return "", int(ir.GetStatus().GetCode())
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.DefaultTargetHeader {
			return string(h.GetHeader().GetRawValue()), 200
		}
	}
	t.Fatalf("no target header in %v", resp)
	return "", 0
}

// routeCode sends one chat request as route does and returns how the
// stream ended: OK when it answered, else the gRPC code.
func routeCode(t *testing.T, cc *grpc.ClientConn, body string) codes.Code {
	t.Helper()
	st, cancel := sendChat(t, cc, body)
	defer cancel()
	_, err := st.Recv()
	return status.Code(err)
}

func chatBody(words int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"go"}]}`,
		model, strings.Repeat("prefix caching pays off ", words))
}

func promptTokens(t *testing.T, body string) []uint32 {
	t.Helper()
	c, err := tokenizer.LoadChat(qwenDir, "", tokenizer.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req, err := tokenizer.ParseChatRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := c.EncodeChat(req)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// startReady starts a router over a static file of n workers and waits
// until it is ready.
func startReady(t *testing.T, n int) (*Server, *grpc.ClientConn) {
	t.Helper()
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, n)
	r := start(t, cfg)
	eventually(t, "ready", r.Ready)
	return r, dial(t, r)
}

func TestRouterEventsOverNATSChangeTheNextDecision(t *testing.T) {
	r, cc := startReady(t, 3)

	hc, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{Service: extproc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "grpc health SERVING", func() bool {
		hc, err = healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{Service: extproc.ServiceName})
		return err == nil && hc.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})

	body := chatBody(300)
	tokens := promptTokens(t, body)
	// Decide once: the worker chosen now is not the one we will fill.
	first, status := route(t, cc, body)
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	target := "w0"
	if first == "w0" {
		target = "w1"
	}
	nc, err := nats.Connect(r.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	blocks := len(tokens) / 16
	hs := make([]vllmwire.EngineHash, blocks)
	for i := range hs {
		hs[i] = vllmwire.HashInt(int64(i + 1))
	}
	batch := vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: tokens[:blocks*16], BlockSize: 16}}}
	if err := bus.PublishEvents(nc, r.cfg.Namespace, target, 0, batch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "index holds the blocks", func() bool { return r.Index().Stats().Entries >= blocks })
	got, status := route(t, cc, body)
	if status != 200 || got != target {
		t.Fatalf("after events on %s the request went to %s (%d)", target, got, status)
	}

	base, admin := "http://"+r.HTTPAddr(), "http://"+r.AdminAddr()
	t.Run("explain shows every worker's terms without side effects", func(t *testing.T) {
		eventually(t, "earlier streams freed", func() bool { return activeRequests(r) == 0 })
		resp, err := http.Post(admin+"/debug/explain", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var exp picker.Explanation
		if err := json.NewDecoder(resp.Body).Decode(&exp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || exp.Chosen != target || len(exp.Decision.Workers) != 3 || exp.CachedTokens != blocks*16 {
			t.Errorf("explain %d %+v", resp.StatusCode, exp)
		}
		if activeRequests(r) != 0 {
			t.Error("explain changed the load")
		}
	})
	t.Run("metrics", func(t *testing.T) {
		text := get(t, base+"/metrics", 200)
		for _, want := range []string{`kvroute_requests_total{mode="kv",model="Qwen/Qwen3-8B",outcome="routed",worker="` + target + `"}`,
			"kvroute_decision_duration_seconds_bucket", `kvroute_kv_events_total{outcome="applied",type="BlockStored"} 1`,
			"kvroute_index_entries", "kvroute_kv_event_queue_depth 0", `kvroute_workers{state="ready"} 3`, "kvroute_extproc_streams_total",
			`kvroute_worker_prefill_rate_tokens_per_second{worker="w2"}`, `kvroute_worker_prefill_backlog_tokens{worker="w2"}`,
			`kvroute_worker_prefill_context_seconds{worker="w2"}`, `kvroute_worker_prefill_shared_pass_seconds{worker="w2"}`, `kvroute_worker_cache_churn_tokens{worker="w2"}`} {
			if !strings.Contains(text, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})
	t.Run("health, readiness and workers", func(t *testing.T) {
		get(t, base+"/healthz", 200)
		get(t, base+"/readyz", 200)
		w := get(t, admin+"/debug/workers", 200)
		if !strings.Contains(w, `{"id":"w2","health":`) || strings.Contains(w, `"record"`) || strings.Count(w, "\n") != 5 {
			t.Errorf("workers, one line each after the head: %s", w)
		}
		if w := get(t, admin+"/debug/workers?verbose=1", 200); !strings.Contains(w, `"record"`) || !strings.Contains(w, `"prefill_overhead_seconds":`) {
			t.Errorf("workers?verbose=1: %s", w)
		}
	})
	t.Run("snake_case JSON, one error shape, an index at /", func(t *testing.T) {
		var index struct {
			Endpoints []struct{ Method, Path string } `json:"endpoints"`
		}
		if err := json.Unmarshal([]byte(get(t, base+"/", 200)), &index); err != nil || len(index.Endpoints) != 4 {
			t.Fatalf("GET / = %+v, %v; want the 4 metrics and health endpoints", index, err)
		}
		if err := json.Unmarshal([]byte(get(t, admin+"/", 200)), &index); err != nil || len(index.Endpoints) != 10 {
			t.Fatalf("admin GET / = %+v, %v; want the 10 debug, snapshot, index and admin endpoints", index, err)
		}
		resp, err := http.Post(admin+"/debug/explain", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		explain, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for path, doc := range map[string]string{"/debug/workers": get(t, admin+"/debug/workers", 200), "/debug/explain": string(explain),
			"/admin/mode": get(t, admin+"/admin/mode", 200), "/readyz": get(t, base+"/readyz", 200), IndexWorkersPath: get(t, admin+IndexWorkersPath, 200)} {
			var v any
			if err := json.Unmarshal([]byte(doc), &v); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if bad := nonSnakeKeys(v); len(bad) > 0 {
				t.Errorf("%s has keys that are not snake_case: %v", path, bad)
			}
		}
		for _, tc := range []struct {
			method, url, path, body string
			status                  int
		}{
			{"GET", base, "/nope", "", 404},
			{"GET", admin, "/nope", "", 404},
			{"GET", base, "/debug/workers", "", 404}, // on the admin listener only
			{"POST", base, "/admin/mode", "", 404},
			{"GET", admin, "/metrics", "", 404},
			{"DELETE", admin, "/debug/workers", "", 405},
			{"POST", admin, "/admin/mode?mode=nonsense", "", 400},
			{"POST", admin, "/admin/mode", "{", 400},
			{"POST", admin, "/debug/explain", "not json", 400},
		} {
			req, _ := http.NewRequest(tc.method, tc.url+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e struct {
				Error *struct {
					Message, Type, Code string
				} `json:"error"`
			}
			err = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode != tc.status || err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
				t.Errorf("%s %s: status %d, error %+v (%v); want %d and an OpenAI-style error", tc.method, tc.path, resp.StatusCode, e.Error, err, tc.status)
			}
		}
	})
	t.Run("mode switch at runtime", func(t *testing.T) {
		resp, err := http.Post(admin+"/admin/mode", "application/json", strings.NewReader(`{"mode":"round_robin"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || r.Mode() != "round_robin" {
			t.Fatalf("status %d mode %s", resp.StatusCode, r.Mode())
		}
		seen := map[string]bool{}
		for range 3 {
			w, _ := route(t, cc, body)
			seen[w] = true
		}
		if len(seen) != 3 {
			t.Errorf("round robin used %v", seen)
		}
		resp, err = http.Post(admin+"/admin/mode?mode=nonsense", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("unknown mode: status %d", resp.StatusCode)
		}
	})
}

func activeRequests(r *Server) int {
	n := 0
	for _, l := range r.Picker().Scheduler().Pool().Snapshot() {
		n += l.ActiveRequests
	}
	return n
}

func get(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d, want %d: %s", url, resp.StatusCode, want, b)
	}
	return string(b)
}

func TestRouterFollowsEtcdRegistrations(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.EtcdEndpoints, cfg.NATSURL = e.Endpoints, n.URL
	r := start(t, cfg)
	if r.Ready() {
		t.Fatal("ready with no workers")
	}
	cc := dial(t, r)
	// No worker known: the stream fails UNAVAILABLE, so Envoy applies its
	// failure mode as if the router were down, rather than a 503 of ours.
	if code := routeCode(t, cc, chatBody(5)); code != codes.Unavailable {
		t.Fatalf("no workers: stream ended %v, want Unavailable", code)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	reg, err := etcd.Register(context.Background(), cli, cfg.Namespace,
		fleet.Worker{ID: "w9", Model: model, Address: "10.0.0.9:8000", BlockSize: 16, KVTotalBlocks: 100}, etcd.RegisterOptions{TTL: 3 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready after registration", r.Ready)
	if w, status := route(t, cc, chatBody(5)); status != 200 || w != "w9" {
		t.Fatalf("routed to %q (%d), want w9", w, status)
	}
	reg.Abandon() // lease lapses
	eventually(t, "not ready after the lease lapsed", func() bool { return !r.Ready() })
	if code := routeCode(t, cc, chatBody(5)); code != codes.Unavailable {
		t.Fatalf("after lease expiry: stream ended %v, want Unavailable (no worker known)", code)
	}
}

func TestRouterRejectsBadConfig(t *testing.T) {
	cfg := testConfig(t)
	if _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "discovery") {
		t.Errorf("no discovery accepted: %v", err)
	}
	cfg.WorkersFile = workersFile(t, 1)
	cfg.Tokenizers = map[string]tokenizer.ModelSource{"m": {Dir: "/nonexistent"}}
	if _, err := Start(context.Background(), cfg); err == nil {
		t.Error("missing tokenizer dir accepted")
	}
}

func TestRouterResponsePathDrivesTheLoad(t *testing.T) {
	r, cc := startReady(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := pb.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *pb.ProcessingRequest) {
		t.Helper()
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() *pb.ProcessingResponse {
		t.Helper()
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	send(&pb.ProcessingRequest{
		Request: &pb.ProcessingRequest_RequestHeaders{RequestHeaders: &pb.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}},
		ProtocolConfig: &pb.ProtocolConfiguration{RequestBodyMode: extprocmode.ProcessingMode_BUFFERED, ResponseBodyMode: extprocmode.ProcessingMode_STREAMED},
	})
	recv() // CONTINUE for the headers
	send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestBody{RequestBody: &pb.HttpBody{Body: []byte(chatBody(200)), EndOfStream: true}}})
	recv() // the route
	load := func() (active, prefill int) {
		for _, l := range r.Picker().Scheduler().Pool().Snapshot() {
			active += l.ActiveRequests
			prefill += l.PrefillTokens
		}
		return
	}
	if a, p := load(); a != 1 || p == 0 {
		t.Fatalf("after routing: %d active, %d prefill tokens", a, p)
	}
	send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_ResponseHeaders{ResponseHeaders: &pb.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}}})
	recv()
	send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_ResponseBody{ResponseBody: &pb.HttpBody{Body: []byte("data: {\"choices\":[]}\n\n")}}})
	recv()
	if a, p := load(); a != 1 || p != 0 {
		t.Fatalf("after the first chunk: %d active, %d prefill tokens; want prefill done", a, p)
	}
	send(&pb.ProcessingRequest{Request: &pb.ProcessingRequest_ResponseBody{ResponseBody: &pb.HttpBody{Body: []byte("data: [DONE]\n\n"), EndOfStream: true}}})
	recv()
	if a, _ := load(); a != 0 {
		t.Fatalf("after the end of the response: %d active", a)
	}
}

func TestRouterDrainsOnShutdown(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 1)
	// A drain far longer than the test: the checks below happen inside it
	// however slow the machine, and Shutdown ends it early.
	cfg.DrainDelay = 5 * time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	r, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready", r.Ready)
	cc := dial(t, r)
	cancel()
	eventually(t, "readiness off", func() bool { return !r.Ready() })
	hc, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{Service: extproc.ServiceName})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health during drain: %v %v", hc.GetStatus(), err)
	}
	// Still routing while draining.
	if w, status := route(t, cc, chatBody(3)); status != 200 || w != "w0" {
		t.Fatalf("during drain: %q %d", w, status)
	}
	if err := r.Shutdown(); err != nil {
		t.Fatal(err)
	}
}

var snakeKey = regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)

// nonSnakeKeys lists the object keys in v that are not snake_case.
func nonSnakeKeys(v any) []string {
	var bad []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if !snakeKey.MatchString(k) {
				bad = append(bad, k)
			}
			bad = append(bad, nonSnakeKeys(e)...)
		}
	case []any:
		for _, e := range x {
			bad = append(bad, nonSnakeKeys(e)...)
		}
	}
	return bad
}
