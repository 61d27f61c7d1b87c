package envoytest

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/kvroute/kvroute/envoy"
	"google.golang.org/protobuf/types/known/structpb"
)

// deadAddr is a loopback ip:port nothing listens on: a connect is refused.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// startResetter is a worker that accepts the request and drops the
// connection before any response: a reset before headers.
func startResetter(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return hostOf(srv)
}

// listRouter routes to the cluster named first and writes the endpoint
// list into envoy.lb metadata, as kvroute does.
func listRouter(cluster, list string) router {
	return router{
		decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
			return setHeaders(envoy.TargetHeader, cluster)
		},
		clear: true,
		meta: func(*corev3.HeaderMap, []byte) *structpb.Struct {
			if list == "" {
				return nil
			}
			return &structpb.Struct{Fields: map[string]*structpb.Value{
				envoy.LBMetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
					envoy.DestinationHeader: structpb.NewStringValue(list)}}),
			}}
		},
	}
}

// startGenerated serves Generate's cluster-header bootstrap for workers,
// optionally edited, with kvroute's part played by proc.
func startGenerated(t *testing.T, workers []envoy.Worker, proc *procServer, edit func(string) string) *Gateway {
	t.Helper()
	out, err := envoy.Generate(envoy.StyleClusterHeader, workers, envoy.Options{ExtProcAddress: proc.addr})
	if err != nil {
		t.Fatal(err)
	}
	return serveGateway(t, string(out), edit, GatewayOptions{ListenAddress: "127.0.0.1:0"})
}

// servedIn is the endpoint override_host reported to ext_proc with the
// response headers.
func servedIn(t *testing.T, s *procSession) string {
	t.Helper()
	for _, m := range s.received {
		if m.GetResponseHeaders() != nil {
			v := m.GetMetadataContext().GetFilterMetadata()[envoy.LBMetadataNamespace].GetFields()[envoy.ServedKey]
			return v.GetStringValue()
		}
	}
	t.Fatal("no response_headers message")
	return ""
}

func TestRetryTakesTheNextEndpointOfTheList(t *testing.T) {
	dead := deadAddr(t)
	w1, w2 := startWorker(t, "w1"), startWorker(t, "w2")
	workers := []envoy.Worker{{Cluster: "w0", Address: dead}, {Cluster: "w1", Address: hostOf(w1)}, {Cluster: "w2", Address: hostOf(w2)}}
	// The runner-up is w2, although round robin over priority 1 would start at w1.
	proc := startProcServer(t, listRouter("w0", dead+","+hostOf(w2)+","+hostOf(w1)).script)
	g := startGenerated(t, workers, proc, nil)
	for i := range 3 {
		resp, got := post(t, g.URL(), `{"n":`+string(rune('0'+i))+`}`)
		if resp.StatusCode != 200 || got.Worker != "w2" {
			t.Fatalf("request %d: status %d from %q, want 200 from the runner-up w2", i, resp.StatusCode, got.Worker)
		}
		if got.Body != `{"n":`+string(rune('0'+i))+`}` {
			t.Fatalf("the retry sent body %q", got.Body)
		}
		if s := servedIn(t, proc.lastSession(t)); s != hostOf(w2) {
			t.Fatalf("served endpoint reported to ext_proc = %q, want %s", s, hostOf(w2))
		}
	}
}

func TestRetryWithoutListLeavesTheFailedPriority(t *testing.T) {
	dead := deadAddr(t)
	w1 := startWorker(t, "w1")
	workers := []envoy.Worker{{Cluster: "w0", Address: dead}, {Cluster: "w1", Address: hostOf(w1)}}
	proc := startProcServer(t, listRouter("w0", "").script)
	g := startGenerated(t, workers, proc, nil)
	resp, got := post(t, g.URL(), `{}`)
	if resp.StatusCode != 200 || got.Worker != "w1" {
		t.Fatalf("status %d from %q, want 200 from w1 (priority 1 after previous_priorities)", resp.StatusCode, got.Worker)
	}
}

func TestRetryHonoursNumRetries(t *testing.T) {
	d1, d2, d3 := deadAddr(t), deadAddr(t), deadAddr(t)
	live := startWorker(t, "w3")
	workers := []envoy.Worker{{Cluster: "w0", Address: d1}, {Cluster: "w1", Address: d2}, {Cluster: "w2", Address: d3}, {Cluster: "w3", Address: hostOf(live)}}
	list := strings.Join([]string{d1, d2, d3, hostOf(live)}, ",")
	for _, tc := range []struct {
		retries string
		want    int
	}{{"2", 503}, {"3", 200}} {
		t.Run("num_retries="+tc.retries, func(t *testing.T) {
			proc := startProcServer(t, listRouter("w0", list).script)
			g := startGenerated(t, workers, proc, edits("num_retries: 1", "num_retries: "+tc.retries))
			resp, _ := post(t, g.URL(), `{}`)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
			if tc.want == 503 {
				if s := servedIn(t, proc.lastSession(t)); s != d3 {
					t.Fatalf("served endpoint after three refused attempts = %q, want the last tried %s", s, d3)
				}
			}
		})
	}
}

func TestRetryOnResetNeedsReset(t *testing.T) {
	resetter := startResetter(t)
	w1 := startWorker(t, "w1")
	workers := []envoy.Worker{{Cluster: "w0", Address: resetter}, {Cluster: "w1", Address: hostOf(w1)}}
	for _, tc := range []struct {
		retryOn string
		want    int
	}{{"connect-failure,reset", 200}, {"connect-failure", 503}} {
		t.Run(tc.retryOn, func(t *testing.T) {
			proc := startProcServer(t, listRouter("w0", resetter+","+hostOf(w1)).script)
			g := startGenerated(t, workers, proc, edits("retry_on: connect-failure,reset", "retry_on: "+tc.retryOn))
			resp, got := post(t, g.URL(), `{"reset":true}`)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d from %q, want %d", resp.StatusCode, got.Worker, tc.want)
			}
			if tc.want == 200 && (got.Worker != "w1" || got.Body != `{"reset":true}`) {
				t.Fatalf("retry served by %q with body %q", got.Worker, got.Body)
			}
		})
	}
}

// The xds style routes every request to the one served cluster; the first
// attempt goes to kvroute's pick, the retry to the next listed endpoint
// (w2, not w1, which round robin would pick), and the worker never sees
// x-target-worker.
func TestXDSWorkerClusterRetriesOnTheRunnerUp(t *testing.T) {
	dead := deadAddr(t)
	w1, w2 := startWorker(t, "w1"), startWorker(t, "w2")
	workers := []envoy.Worker{{Cluster: "w0", Address: dead}, {Cluster: "w1", Address: hostOf(w1)}, {Cluster: "w2", Address: hostOf(w2)}}
	proc := startProcServer(t, listRouter("w0", dead+","+hostOf(w2)).script)
	g, err := StartGateway(context.Background(), envoy.StyleXDS, workers, proc.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	for i := range 4 {
		resp, got := post(t, g.URL(), `{}`)
		if resp.StatusCode != 200 || got.Worker != "w2" {
			t.Fatalf("request %d: status %d from %q, want 200 from w2 (kvroute's runner-up)", i, resp.StatusCode, got.Worker)
		}
		if h := http.Header(got.Headers); h.Get(envoy.TargetHeader) != "" {
			t.Fatalf("the worker saw %s: %q", envoy.TargetHeader, h.Get(envoy.TargetHeader))
		}
		if s := servedIn(t, proc.lastSession(t)); s != hostOf(w2) {
			t.Fatalf("served endpoint %q, want %s", s, hostOf(w2))
		}
	}
}

// Without kvroute's list (an answer that carries none), the served
// cluster's fallback spreads requests round robin over every worker.
func TestXDSWorkerClusterWithoutAListRoundRobins(t *testing.T) {
	w0, w1 := startWorker(t, "w0"), startWorker(t, "w1")
	workers := []envoy.Worker{{Cluster: "w0", Address: hostOf(w0)}, {Cluster: "w1", Address: hostOf(w1)}}
	proc := startProcServer(t, listRouter("w0", "").script)
	g, err := StartGateway(context.Background(), envoy.StyleXDS, workers, proc.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	served := map[string]int{}
	for i := range 4 {
		resp, got := post(t, g.URL(), `{}`)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		served[got.Worker]++
	}
	if served["w0"] != 2 || served["w1"] != 2 {
		t.Fatalf("served %v, want 2 each (round robin over the shared cluster)", served)
	}
}

// The shipped xds.yaml with GatewayOptions.Endpoints naming kvroute_workers
// gets the cluster kvroute's xDS server would serve for those addresses:
// override_host follows the list (w1 every time, where round robin would
// alternate) and retries a refused first pick on the next listed endpoint.
func TestShippedXDSWithWorkerEndpoints(t *testing.T) {
	dead := deadAddr(t)
	w0, w1 := startWorker(t, "w0"), startWorker(t, "w1")
	proc := startProcServer(t, listRouter("w1", dead+","+hostOf(w1)).script)
	g, err := LoadGateway([]byte(readShipped(t, envoy.StyleXDS)), GatewayOptions{ListenAddress: "127.0.0.1:0", Endpoints: map[string][]string{
		envoy.ExtProcClusterName: {proc.addr}, envoy.WorkersClusterName: {hostOf(w0), dead, hostOf(w1)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	for i := range 3 {
		if resp, got := post(t, g.URL(), `{}`); resp.StatusCode != 200 || got.Worker != "w1" {
			t.Fatalf("request %d: status %d from %q, want 200 from w1", i, resp.StatusCode, got.Worker)
		}
	}
	if _, err := LoadGateway([]byte(readShipped(t, envoy.StyleXDS)), GatewayOptions{Endpoints: map[string][]string{
		envoy.ExtProcClusterName: {proc.addr}, envoy.WorkersClusterName: {"not an address"}}}); err == nil {
		t.Fatal("a bad worker endpoint was accepted")
	}
}
