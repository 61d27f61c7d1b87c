package e2e

import (
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
)

// editWorkerClusters returns a bootstrap edit that changes every static
// worker cluster (all but kvroute's own).
func editWorkerClusters(edit func(*clusterv3.Cluster)) func([]byte) ([]byte, error) {
	return func(data []byte) ([]byte, error) {
		b, err := envoy.ParseBootstrap(data)
		if err != nil {
			return nil, err
		}
		for _, c := range b.GetStaticResources().GetClusters() {
			if c.GetName() != envoy.ExtProcClusterName {
				edit(c)
			}
		}
		return protojson.Marshal(b)
	}
}

// Envoy's own 5xx replies, made without the worker at fault, never count
// against the worker kvroute picked: Envoy tells kvroute who made the
// response (response.code_details), and only the worker's own 5xx or a
// connection it refused or reset feed passive health.
func TestEnvoyLocalRepliesNeverEjectAWorker(t *testing.T) {
	silent := silentPort(t)
	for _, tc := range []struct {
		name string
		edit func(*clusterv3.Cluster)
	}{
		{"overflow", func(c *clusterv3.Cluster) {
			th := c.GetCircuitBreakers().GetThresholds()[0]
			th.MaxConnections, th.MaxPendingRequests, th.MaxRequests = wrapperspb.UInt32(0), wrapperspb.UInt32(0), wrapperspb.UInt32(0)
		}},
		{"no_healthy_upstream", func(c *clusterv3.Cluster) {
			c.LoadAssignment.Endpoints = nil
		}},
		{"connect_timeout", func(c *clusterv3.Cluster) {
			c.ConnectTimeout = durationpb.New(200 * time.Millisecond)
			for _, l := range c.GetLoadAssignment().GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					sa := e.GetEndpoint().GetAddress().GetSocketAddress()
					sa.Address, sa.PortSpecifier = "127.0.0.1", &corev3.SocketAddress_PortValue{PortValue: uint32(silent)}
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, options{workers: 2})
			_ = s.Envoy.Close()
			p, err := bench.StartEnvoy(t.Context(), bench.EnvoyConfig{
				Style: envoy.StyleClusterHeader, Workers: s.EnvoyWorkers(), ExtProcAddr: s.Router.GRPCAddr(),
				Edit: editWorkerClusters(tc.edit),
			})
			if err != nil {
				t.Fatal(err)
			}
			s.Envoy = p
			t.Cleanup(func() { _ = p.Close() })
			const n = 6
			for i := range n {
				r := s.sendWithHeaders(t, chat(longText(fmt.Sprintf("local %d", i), 4), "q"), nil)
				if r.status < 500 {
					t.Fatalf("request %d: status %d, want Envoy's own 5xx", i, r.status)
				}
			}
			eventually(t, "every request to be freed", func() bool {
				return s.metric(t, "kvroute_requests_finished_total") == n
			})
			t.Logf("finished: local_reply %v, upstream_error %v", s.metric(t, "kvroute_requests_finished_total", `outcome="local_reply"`),
				s.metric(t, "kvroute_requests_finished_total", `outcome="upstream_error"`))
			if got := s.metric(t, "kvroute_requests_finished_total", `outcome="local_reply"`); got != n {
				t.Errorf("%v of %d requests ended as local replies", got, n)
			}
			if e := s.metric(t, "kvroute_worker_ejections_total"); e != 0 {
				t.Errorf("%v ejections for Envoy's own replies", e)
			}
		})
	}
}

// silentPort returns a loopback port whose listener never accepts and whose
// queue is full, so that a new connection's SYN is dropped and its connect
// times out (a refused connection would be the worker's fault).
func silentPort(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	// Fill the accept queue (backlog 0 still admits one); later SYNs are
	// dropped.
	for range 3 {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	return port
}

// A worker Envoy answers for (its cluster has no healthy host) is not
// ejected, but it is passed over for a moment: it looks idle to the
// router, since no request reaches it, and used to draw most of the
// traffic (130 of 160 requests). Requests come four at a time, so the
// healthy worker is the busier one whenever the router picks.
func TestEnvoyLocalRepliesPassTheWorkerOver(t *testing.T) {
	s := start(t, options{workers: 2})
	broken := s.EnvoyWorkers()[0].Cluster
	_ = s.Envoy.Close()
	p, err := bench.StartEnvoy(t.Context(), bench.EnvoyConfig{
		Style: envoy.StyleClusterHeader, Workers: s.EnvoyWorkers(), ExtProcAddr: s.Router.GRPCAddr(),
		Edit: editWorkerClusters(func(c *clusterv3.Cluster) {
			if c.GetName() == broken {
				c.LoadAssignment.Endpoints = nil
			}
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Envoy = p
	t.Cleanup(func() { _ = p.Close() })
	const rounds, per = 5, 4
	var mu sync.Mutex
	served, failed := 0, 0
	for round := range rounds {
		var wg sync.WaitGroup
		for i := range per {
			wg.Go(func() {
				r := s.sendWithHeaders(t, chat(longText(fmt.Sprintf("cool %d %d", round, i), 4), "q"), nil)
				mu.Lock()
				defer mu.Unlock()
				if r.status == 200 {
					served++
				} else {
					failed++
				}
			})
		}
		wg.Wait()
	}
	t.Logf("%d served, %d answered by Envoy for %s", served, failed, broken)
	if failed == 0 {
		t.Fatalf("no request reached %s's empty cluster; the test shows nothing", broken)
	}
	if served < rounds*per*3/4 {
		t.Errorf("%d of %d requests served: the worker Envoy answers for kept drawing traffic", served, rounds*per)
	}
	if e := s.metric(t, "kvroute_worker_ejections_total"); e != 0 {
		t.Errorf("%v ejections for Envoy's own replies", e)
	}
}
