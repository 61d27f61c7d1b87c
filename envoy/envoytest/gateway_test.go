package envoytest

import (
	"context"
	"encoding/json"
	"github.com/kvroute/kvroute/envoy"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// seen is what an echo worker reports about the request it received.
type seen struct {
	Worker   string              `json:"worker"`
	Method   string              `json:"method"`
	Host     string              `json:"host"`
	Path     string              `json:"path"`
	Headers  map[string][]string `json:"headers"`
	Body     string              `json:"body"`
	Trailers map[string][]string `json:"trailers"`
}

// startWorker is a real HTTP server standing in for an inference worker: it
// echoes the request it got as JSON and sets a response trailer when asked.
func startWorker(t testing.TB, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		out := seen{Worker: name, Method: r.Method, Host: r.Host, Path: r.URL.RequestURI(),
			Headers: r.Header, Body: string(body), Trailers: r.Trailer}
		if r.Header.Get("X-Want-Trailer") != "" {
			w.Header().Set("Trailer", "X-Worker-Trailer")
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
		if r.Header.Get("X-Want-Trailer") != "" {
			w.Header().Set("X-Worker-Trailer", "done")
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func hostOf(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

// fleet is four workers plus a separate fallback server, wired into the
// shipped cluster-header.yaml.
type fleet struct {
	workers  map[string]*httptest.Server
	fallback *httptest.Server
}

func startFleet(t *testing.T) fleet {
	f := fleet{workers: map[string]*httptest.Server{}, fallback: startWorker(t, "fallback")}
	for _, w := range envoy.ExampleWorkers {
		f.workers[w.Cluster] = startWorker(t, w.Cluster)
	}
	return f
}

func (f fleet) endpoints(procAddr string) map[string][]string {
	eps := map[string][]string{envoy.ExtProcClusterName: {procAddr}, envoy.FallbackClusterName: {hostOf(f.fallback)}}
	for name, s := range f.workers {
		eps[name] = []string{hostOf(s)}
	}
	return eps
}

// startGateway loads a shipped bootstrap, optionally edited, and serves it.
func startGateway(t *testing.T, style string, edit func(string) string, eps map[string][]string) *Gateway {
	t.Helper()
	return serveGateway(t, readShipped(t, style), edit, GatewayOptions{ListenAddress: "127.0.0.1:0", Endpoints: eps})
}

// serveGateway loads the bootstrap src, edited by edit when given, serves
// it until the test ends, and returns the Gateway.
func serveGateway(t *testing.T, src string, edit func(string) string, opts GatewayOptions) *Gateway {
	t.Helper()
	if edit != nil {
		src = edit(src)
	}
	g, err := LoadGateway([]byte(src), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := g.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return g
}

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, seen) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var s seen
	if resp.Header.Get("Content-Type") == "application/json" {
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatalf("worker reply %q: %v", raw, err)
		}
	} else {
		s.Body = string(raw)
	}
	return resp, s
}

// pickFromBody routes to the worker named in the body's "user" field, like
// kvroute deciding from the prompt.
func pickFromBody(_ *corev3.HeaderMap, body []byte) *extprocsvc.HeaderMutation {
	var req struct {
		User string `json:"user"`
	}
	_ = json.Unmarshal(body, &req)
	return setHeaders(envoy.TargetHeader, req.User)
}

func TestBufferedModeRoutesOnClusterHeader(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, router{decide: pickFromBody, clear: true}.script)
	g := startGateway(t, envoy.StyleClusterHeader, nil, f.endpoints(proc.addr))

	resp, got := post(t, g.URL(), `{"user":"w2","messages":[]}`, "X-Target-Worker", "w3")
	if resp.StatusCode != 200 || got.Worker != "w2" {
		t.Fatalf("status %d, served by %q; want 200 from w2", resp.StatusCode, got.Worker)
	}
	if _, leaked := got.Headers["X-Target-Worker"]; leaked {
		t.Fatal("x-target-worker reached the worker")
	}
	if resp.Header.Get("X-Kvroute") != "seen" {
		t.Fatal("response header mutation not applied")
	}
	s := proc.lastSession(t)
	want := []string{"request_headers", "request_body_eos", "response_headers", "response_body_eos"}
	if k := s.kinds(); !slices.Equal(k, want) {
		t.Fatalf("message order %v, want %v", k, want)
	}
	first := s.received[0]
	pc := first.GetProtocolConfig()
	if pc.GetRequestBodyMode() != extprocv3.ProcessingMode_BUFFERED || pc.GetResponseBodyMode() != extprocv3.ProcessingMode_STREAMED {
		t.Fatalf("protocol_config on first message = %v", pc)
	}
	if s.received[1].GetProtocolConfig() != nil {
		t.Fatal("protocol_config repeated after the first message")
	}
	for _, h := range first.GetRequestHeaders().GetHeaders().GetHeaders() {
		if h.GetValue() != "" {
			t.Fatalf("header %s sent in value, not raw_value", h.GetKey())
		}
	}
	if v, _ := headerValue(first.GetRequestHeaders().GetHeaders(), ":path"); v != "/v1/chat/completions" {
		t.Fatalf(":path raw_value = %q", v)
	}
	// BUFFERED: the body goes out only after the headers answer came back.
	if s.recvAt[1].Before(s.sentAt[0]) {
		t.Fatal("body sent before the request_headers answer")
	}
	if s.endErr == nil || !strings.Contains(s.endErr.Error(), "EOF") {
		t.Fatalf("stream should end with a half-close (EOF), got %v", s.endErr)
	}
}

func TestClearRouteCacheRepicksRoute(t *testing.T) {
	cases := []struct {
		name   string
		clear  bool
		action string // route_cache_action added to the filter, if any
		want   string
	}{
		{"clear re-picks", true, "", "w1"},
		{"no clear keeps the first route", false, "", "fallback"},
		{"action CLEAR clears on any header mutation", false, "CLEAR", "w1"},
		{"action RETAIN ignores clear", true, "RETAIN", "fallback"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t)
			proc := startProcServer(t, router{decide: pickFromBody, clear: tc.clear}.script)
			edit := func(s string) string { return s }
			if tc.action != "" {
				edit = edits("failure_mode_allow: true", "failure_mode_allow: true\n              route_cache_action: "+tc.action)
			}
			g := startGateway(t, envoy.StyleClusterHeader, edit, f.endpoints(proc.addr))
			_, got := post(t, g.URL(), `{"user":"w1"}`)
			if got.Worker != tc.want {
				t.Fatalf("served by %q, want %q", got.Worker, tc.want)
			}
		})
	}
}

func TestClearRouteCacheNeedsHeaderMutation(t *testing.T) {
	pc := &procConfig{}
	if pc.clearsRouteCache(&extprocsvc.CommonResponse{ClearRouteCache: true}) {
		t.Fatal("Envoy ignores clear_route_cache in an answer without a header mutation")
	}
	if !pc.clearsRouteCache(&extprocsvc.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocsvc.HeaderMutation{}}) {
		t.Fatal("clear_route_cache with a header mutation must clear")
	}
}

func TestFullDuplexRoutesThroughOriginalDst(t *testing.T) {
	worker := startWorker(t, "w-dst")
	dst := hostOf(worker)
	proc := startProcServer(t, router{
		decide: func(_ *corev3.HeaderMap, body []byte) *extprocsvc.HeaderMutation {
			return setHeaders(envoy.DestinationHeader, dst, envoy.TargetHeader, "w-dst")
		},
		// The processor re-chunks and rewrites the body; the worker must get its version.
		reqChunker: func(b []byte) [][]byte { return [][]byte{b[:3], []byte(strings.ToUpper(string(b[3:])))} },
		transform:  func(b []byte) []byte { return []byte(strings.ReplaceAll(string(b), "w-dst", "W-DST")) },
	}.script)
	g := startGateway(t, envoy.StyleOriginalDst, nil, map[string][]string{envoy.ExtProcClusterName: {proc.addr}})

	big := `{"user":"x","prompt":"` + strings.Repeat("a", 100_000) + `"}`
	resp, s := post(t, g.URL(), big)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %.200s", resp.StatusCode, s.Body)
	}
	if s.Worker != "W-DST" {
		t.Fatalf("response body not the processor's streamed version: worker=%q", s.Worker)
	}
	if s.Body != big[:3]+strings.ToUpper(big[3:]) {
		t.Fatal("worker did not receive the processor's streamed request body")
	}
	if _, leaked := s.Headers["X-Target-Worker"]; leaked {
		t.Fatal("x-target-worker reached the worker")
	}
	if s.Headers["X-Gateway-Destination-Endpoint"][0] != dst {
		t.Fatal("destination header lost")
	}
	sess := proc.lastSession(t)
	k := sess.kinds()
	if k[0] != "request_headers" || !slices.Contains(k, "request_body") || !slices.Contains(k, "response_body_eos") {
		t.Fatalf("message kinds %v", k)
	}
	if sess.received[0].GetProtocolConfig().GetRequestBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Fatal("protocol_config does not say FULL_DUPLEX_STREAMED")
	}
	// Streaming without waiting: the whole body reached the processor before
	// it sent its first answer (the headers response).
	var lastBody time.Time
	for i, m := range sess.received {
		if m.GetRequestBody().GetEndOfStream() {
			lastBody = sess.recvAt[i]
		}
	}
	if lastBody.IsZero() || lastBody.After(sess.sentAt[0]) {
		t.Fatal("request body was not streamed before the headers answer")
	}
}

func TestFullDuplexCarriesTrailers(t *testing.T) {
	worker := startWorker(t, "w-dst")
	proc := startProcServer(t, router{decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
		return setHeaders(envoy.DestinationHeader, hostOf(worker))
	}}.script)
	g := startGateway(t, envoy.StyleOriginalDst, nil, map[string][]string{envoy.ExtProcClusterName: {proc.addr}})

	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, g.URL()+"/v1/completions", pr)
	req.Trailer = http.Header{"X-Client-Trailer": nil}
	req.Header.Set("X-Want-Trailer", "1")
	go func() {
		_, _ = pw.Write([]byte(`{"prompt":"hi"}`))
		req.Trailer.Set("X-Client-Trailer", "bye")
		_ = pw.Close()
	}()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var s seen
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	if s.Trailers["X-Client-Trailer"][0] != "bye" || s.Trailers["X-Proc-Trailer"] == nil {
		t.Fatalf("worker trailers %v: want the client's and the processor's", s.Trailers)
	}
	if resp.Trailer.Get("X-Worker-Trailer") != "done" || resp.Trailer.Get("X-Proc-Response-Trailer") != "seen" {
		t.Fatalf("client trailers %v", resp.Trailer)
	}
	k := proc.lastSession(t).kinds()
	if !slices.Contains(k, "request_trailers") || !slices.Contains(k, "response_trailers") {
		t.Fatalf("trailer messages missing: %v", k)
	}
}

func TestHeaderMutationsFollowEnvoyRules(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, router{decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
		hm := setHeaders(envoy.TargetHeader, "w0", "x-envoy-upstream-alt", "no", "host", "evil", ":authority", "evil",
			":method", "DELETE", ":scheme", "https", ":path", "/rewritten", "x-added", "yes")
		hm.RemoveHeaders = []string{"x-drop-me", ":path", "host"}
		return hm
	}, clear: true}.script)
	g := startGateway(t, envoy.StyleClusterHeader, nil, f.endpoints(proc.addr))

	_, got := post(t, g.URL(), `{}`, "X-Drop-Me", "1", "X-Keep", "1")
	if got.Worker != "w0" {
		t.Fatalf("served by %q", got.Worker)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"x-envoy-* ignored", got.Headers["X-Envoy-Upstream-Alt"] == nil},
		{"host/:authority ignored", got.Host == strings.TrimPrefix(g.URL(), "http://")},
		{":method ignored", got.Method == http.MethodPost},
		{":path may change", got.Path == "/rewritten"},
		{"ordinary header added", got.Headers["X-Added"] != nil},
		{"ordinary header removed", got.Headers["X-Drop-Me"] == nil},
		{"other headers kept", got.Headers["X-Keep"] != nil},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: worker saw %+v", c.what, got)
		}
	}
}

func TestImmediateResponseGoesToClient(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, func(s *procSession) error {
		if _, err := s.recv(); err != nil {
			return err
		}
		return s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ImmediateResponse{
			ImmediateResponse: &extprocsvc.ImmediateResponse{
				Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
				Headers: setHeaders("content-type", "application/json", "retry-after", "1"),
				Body:    []byte(`{"error":{"message":"queue full","type":"rate_limit"}}`),
			}}})
	})
	g := startGateway(t, envoy.StyleClusterHeader, nil, f.endpoints(proc.addr))
	resp, got := post(t, g.URL(), `{}`)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || got.Worker != "" {
		t.Fatalf("status %d retry-after %q worker %q", resp.StatusCode, resp.Header.Get("Retry-After"), got.Worker)
	}
}

// With body modes NONE kvroute routes on headers alone and sees no bodies.
func TestBodyModeNoneRoutesOnHeaders(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, router{decide: func(h *corev3.HeaderMap, _ []byte) *extprocsvc.HeaderMutation {
		user, _ := headerValue(h, "x-user")
		return setHeaders(envoy.TargetHeader, user)
	}, clear: true}.script)
	g := startGateway(t, envoy.StyleClusterHeader, edits("request_body_mode: BUFFERED", "request_body_mode: NONE",
		"response_body_mode: STREAMED", "response_body_mode: NONE"), f.endpoints(proc.addr))
	resp, got := post(t, g.URL(), `{"user":"ignored"}`, "X-User", "w3")
	if resp.StatusCode != 200 || got.Worker != "w3" || got.Body != `{"user":"ignored"}` {
		t.Fatalf("status %d worker %q body %q", resp.StatusCode, got.Worker, got.Body)
	}
	s := proc.lastSession(t)
	if k := s.kinds(); !slices.Equal(k, []string{"request_headers", "response_headers"}) {
		t.Fatalf("kinds %v", k)
	}
	if s.received[0].GetProtocolConfig().GetRequestBodyMode() != extprocv3.ProcessingMode_NONE {
		t.Fatal("protocol_config does not say NONE")
	}
}
