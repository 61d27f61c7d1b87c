package envoytest

import (
	"context"
	"github.com/kvroute/kvroute/envoy"
	"net"
	"net/http"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func edits(pairs ...string) func(string) string {
	return func(s string) string {
		for i := 0; i+1 < len(pairs); i += 2 {
			if !strings.Contains(s, pairs[i]) {
				panic("edit anchor not found: " + pairs[i])
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		return s
	}
}

// stall answers nothing and waits until the Gateway gives up on the stream.
func stall(s *procSession) error {
	if _, err := s.recv(); err != nil {
		return err
	}
	<-s.stream.Context().Done()
	_, err := s.recv() // records how the stream ended
	return err
}

func TestMessageTimeoutObeysFailureModeAllow(t *testing.T) {
	cases := []struct {
		name       string
		allow      string
		wantStatus int
		wantWorker string
	}{
		{"fail open goes on without kvroute", "true", 200, "fallback"},
		{"fail closed answers 504", "false", 504, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t)
			proc := startProcServer(t, stall)
			g := startGateway(t, envoy.StyleClusterHeader, edits("message_timeout: 60s", "message_timeout: 0.2s",
				"failure_mode_allow: true", "failure_mode_allow: "+tc.allow), f.endpoints(proc.addr))
			resp, got := post(t, g.URL(), `{"user":"w1"}`)
			if resp.StatusCode != tc.wantStatus || got.Worker != tc.wantWorker {
				t.Fatalf("status %d worker %q, want %d %q", resp.StatusCode, got.Worker, tc.wantStatus, tc.wantWorker)
			}
			if s := proc.lastSession(t); status.Code(s.endErr) != codes.Canceled {
				t.Fatalf("the timed-out stream should be cancelled, ended with %v", s.endErr)
			}
		})
	}
}

func TestSpuriousMessageClosesStreamAndContinues(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, func(s *procSession) error {
		if _, err := s.recv(); err != nil {
			return err
		}
		// A response_headers answer to request_headers is out of order.
		if err := s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocsvc.HeadersResponse{Response: common(setHeaders(envoy.TargetHeader, "w1"), true)}}}); err != nil {
			return err
		}
		<-s.stream.Context().Done()
		return nil
	})
	g := startGateway(t, envoy.StyleClusterHeader, edits("failure_mode_allow: true", "failure_mode_allow: false"), f.endpoints(proc.addr))
	resp, got := post(t, g.URL(), `{}`)
	if resp.StatusCode != 200 || got.Worker != "fallback" {
		t.Fatalf("status %d worker %q: a spurious message must stop processing, not fail or apply", resp.StatusCode, got.Worker)
	}
	if s := proc.lastSession(t); len(s.kinds()) != 1 {
		t.Fatalf("the Gateway kept talking after the spurious message: %v", s.kinds())
	}
}

// The xds bootstrap fails open: with kvroute unreachable, or failing a
// stream, every request is still served, by override_host's round-robin
// fallback over the one workers cluster, so all workers take turns.
func TestXDSFailsOpenRoundRobinOverTheWorkers(t *testing.T) {
	grpcError := func(s *procSession) error {
		_, _ = s.recv()
		return status.Error(codes.Internal, "boom")
	}
	for name, script := range map[string]func(*procSession) error{"unreachable": nil, "gRPC error": grpcError} {
		t.Run(name, func(t *testing.T) {
			f := startFleet(t)
			var workers []envoy.Worker
			for name, w := range f.workers {
				workers = append(workers, envoy.Worker{Cluster: name, Address: hostOf(w)})
			}
			addr := deadAddr(t)
			if script != nil {
				addr = startProcServer(t, script).addr
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g, err := StartGateway(ctx, envoy.StyleXDS, workers, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			served := map[string]int{}
			for i := 0; i < 2*len(workers); i++ {
				resp, got := post(t, g.URL(), `{}`)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d, want 200 from a fail-open gateway", i, resp.StatusCode)
				}
				served[got.Worker]++
			}
			for name := range f.workers {
				if served[name] != 2 {
					t.Fatalf("served %v over %d requests, want every worker twice (round robin)", served, 2*len(workers))
				}
			}
		})
	}
}

func TestProcessorFailures(t *testing.T) {
	grpcError := func(s *procSession) error {
		_, _ = s.recv()
		return status.Error(codes.Internal, "boom")
	}
	cases := []struct {
		name       string
		style      string
		script     func(*procSession) error // nil: nothing listens
		wantStatus int
	}{
		{"unreachable, fail open", envoy.StyleClusterHeader, nil, 200},
		{"unreachable, fail closed", envoy.StyleOriginalDst, nil, 500},
		{"gRPC error, fail open", envoy.StyleClusterHeader, grpcError, 200},
		{"gRPC error, fail closed", envoy.StyleOriginalDst, grpcError, 500},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t)
			addr := deadAddr(t)
			if tc.script != nil {
				addr = startProcServer(t, tc.script).addr
			}
			eps := map[string][]string{envoy.ExtProcClusterName: {addr}}
			if tc.style == envoy.StyleClusterHeader {
				eps = f.endpoints(addr)
			}
			g := startGateway(t, tc.style, nil, eps)
			resp, got := post(t, g.URL(), `{}`)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d (worker %q), want %d", resp.StatusCode, got.Worker, tc.wantStatus)
			}
		})
	}
}

func TestRouterFailuresPassThroughResponsePath(t *testing.T) {
	cases := []struct {
		name       string
		style      string
		headers    []string
		wantStatus int
		wantBody   string
	}{
		{"unknown cluster", envoy.StyleClusterHeader, []string{envoy.TargetHeader, "w9"}, 503, ""},
		{"destination list is not one ip:port", envoy.StyleOriginalDst, []string{envoy.DestinationHeader, "127.0.0.1:1,127.0.0.1:2"}, 503, "no healthy upstream"},
		{"destination host name", envoy.StyleOriginalDst, []string{envoy.DestinationHeader, "localhost:80"}, 503, "no healthy upstream"},
		{"worker down", envoy.StyleClusterHeader, []string{envoy.TargetHeader, "w0"}, 503, "upstream connect error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t)
			f.workers["w0"].Close()
			proc := startProcServer(t, router{decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
				return setHeaders(tc.headers...)
			}, clear: true}.script)
			eps := map[string][]string{envoy.ExtProcClusterName: {proc.addr}}
			if tc.style == envoy.StyleClusterHeader {
				eps = f.endpoints(proc.addr)
			}
			g := startGateway(t, tc.style, nil, eps)
			resp, got := post(t, g.URL(), `{}`)
			if resp.StatusCode != tc.wantStatus || !strings.Contains(got.Body, tc.wantBody) {
				t.Fatalf("status %d body %q, want %d %q", resp.StatusCode, got.Body, tc.wantStatus, tc.wantBody)
			}
			s := proc.lastSession(t)
			var code string
			for _, m := range s.received {
				if h := m.GetResponseHeaders(); h != nil {
					code, _ = headerValue(h.GetHeaders(), ":status")
				}
			}
			if code != "503" {
				t.Fatalf("kvroute did not see the local reply's response headers (:status %q); kinds %v", code, s.kinds())
			}
		})
	}
}

func TestBufferedBodyOverLimitIs413(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, router{decide: pickFromBody, clear: true}.script)
	g := startGateway(t, envoy.StyleClusterHeader, edits("per_connection_buffer_limit_bytes: 33554432", "per_connection_buffer_limit_bytes: 1024"),
		f.endpoints(proc.addr))
	resp, _ := post(t, g.URL(), strings.Repeat("x", 2048))
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
	resp, got := post(t, g.URL(), `{"user":"w3"}`)
	if resp.StatusCode != 200 || got.Worker != "w3" {
		t.Fatalf("small body: status %d worker %q", resp.StatusCode, got.Worker)
	}
}

// With kvroute down and the cluster-header bootstrap failing open, a
// client's own x-target-worker (naming a worker, or kvroute's own cluster)
// and x-gateway-destination-endpoint do not steer the request: the early
// header mutation drops them before routing and ext_proc, so the request
// takes the fallback route. (A bootstrap without that mutation does not
// load: envoy.Validate refuses it.)
func TestClientRoutingHeadersCannotSteerAFailOpenGateway(t *testing.T) {
	f := startFleet(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	target := envoy.ExampleWorkers[1].Cluster
	for _, tc := range []struct {
		name, header string
		want         string
	}{
		{"a worker by cluster name", target, "fallback"},
		{"kvroute's own cluster", envoy.ExtProcClusterName, "fallback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, envoy.StyleClusterHeader, nil, f.endpoints(deadAddr))
			resp, got := post(t, g.URL(), `{}`, envoy.TargetHeader, tc.header, envoy.DestinationHeader, hostOf(f.workers[target]))
			if resp.StatusCode != 200 || got.Worker != tc.want {
				t.Fatalf("status %d, served by %q; want 200 from %q", resp.StatusCode, got.Worker, tc.want)
			}
			if h := http.Header(got.Headers); tc.want == "fallback" && (h.Get(envoy.TargetHeader) != "" || h.Get(envoy.DestinationHeader) != "") {
				t.Errorf("the worker saw client routing headers: %v", got.Headers)
			}
		})
	}
}
