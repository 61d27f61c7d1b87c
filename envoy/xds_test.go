package envoy

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// adsClient is Envoy's side of one ADS stream, reduced to CDS: it sends a
// wildcard cluster request, ACKs every response, and hands back the
// clusters of each response.
type adsClient struct {
	t      *testing.T
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
}

func startXDS(t *testing.T, nodeID string) (*XDSServer, string) {
	t.Helper()
	srv := NewXDSServer(nodeID, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve after cancel: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after its context ended")
		}
	})
	return srv, lis.Addr().String()
}

func dialADS(t *testing.T, addr, nodeID string) *adsClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &adsClient{t: t, stream: stream, node: &corev3.Node{Id: nodeID, Cluster: "kvroute-gateway"}}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: c.node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	return c
}

// next waits for the next CDS response, ACKs it and returns its version
// and clusters by name.
func (c *adsClient) next() (string, map[string]*clusterv3.Cluster) {
	c.t.Helper()
	resp, err := c.stream.Recv()
	if err != nil {
		c.t.Fatalf("ADS recv: %v", err)
	}
	if resp.GetTypeUrl() != resource.ClusterType {
		c.t.Fatalf("response type %q, want %q", resp.GetTypeUrl(), resource.ClusterType)
	}
	got := map[string]*clusterv3.Cluster{}
	for _, a := range resp.GetResources() {
		var cl clusterv3.Cluster
		if err := a.UnmarshalTo(&cl); err != nil {
			c.t.Fatalf("unpack cluster: %v", err)
		}
		if err := cl.ValidateAll(); err != nil {
			c.t.Errorf("cluster %q fails Envoy's validation: %v", cl.GetName(), err)
		}
		got[cl.GetName()] = &cl
	}
	ack := &discoverygrpc.DiscoveryRequest{Node: c.node, TypeUrl: resource.ClusterType,
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	if err := c.stream.Send(ack); err != nil {
		c.t.Fatalf("ADS ack: %v", err)
	}
	return resp.GetVersionInfo(), got
}

func names(m map[string]*clusterv3.Cluster) []string {
	var n []string
	for k := range m {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

// endpointAddrs lists the cluster's endpoints as host:port, priority by
// priority.
func endpointAddrs(c *clusterv3.Cluster) []string {
	var out []string
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			out = append(out, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
		}
	}
	return out
}

// The xDS server serves exactly one cluster, kvroute_workers, whose
// endpoints follow SetWorkers: each worker once, in order. Before the
// first SetWorkers it serves nothing, not an empty cluster: an Envoy
// asking then (its router restarted) keeps the hosts it has.
func TestXDSWorkerClusterFollowsSetWorkers(t *testing.T) {
	srv, addr := startXDS(t, DefaultNodeID)
	ads := dialADS(t, addr, DefaultNodeID) // asks before any set
	if v := srv.Version(); v != "0" {
		t.Fatalf("version %q before any SetWorkers, want 0", v)
	}
	steps := []struct {
		name    string
		workers []Worker
		want    []string
		typ     clusterv3.Cluster_DiscoveryType
	}{
		{"two workers appear", []Worker{{"w0", "10.0.0.1:8000"}, {"w1", "10.0.0.2:8000"}}, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, clusterv3.Cluster_STATIC},
		{"a third joins", []Worker{{"w0", "10.0.0.1:8000"}, {"w1", "10.0.0.2:8000"}, {"w2", "vllm-2.vllm:8000"}},
			[]string{"10.0.0.1:8000", "10.0.0.2:8000", "vllm-2.vllm:8000"}, clusterv3.Cluster_STRICT_DNS},
		{"one leaves", []Worker{{"w0", "10.0.0.1:8000"}, {"w2", "vllm-2.vllm:8000"}}, []string{"10.0.0.1:8000", "vllm-2.vllm:8000"}, clusterv3.Cluster_STRICT_DNS},
		{"ranks sharing an address", []Worker{{"w0", "10.0.0.1:8000"}, {"w0-dp1", "10.0.0.1:8000"}, {"w3", "[fd00::3]:8000"}}, []string{"10.0.0.1:8000", "[fd00::3]:8000"}, clusterv3.Cluster_STATIC},
		{"all leave", nil, nil, clusterv3.Cluster_STATIC},
	}
	prev := "0"
	for i, st := range steps {
		if err := srv.SetWorkers(st.workers); err != nil {
			t.Fatalf("%s: SetWorkers: %v", st.name, err)
		}
		v, got := ads.next()
		if v == prev {
			t.Errorf("%s: version %q did not change", st.name, v)
		}
		if i == 0 && v != "1" {
			t.Fatalf("the first response is version %q, want 1: something was served before the first SetWorkers", v)
		}
		if v != srv.Version() {
			t.Errorf("%s: response version %q, server version %q", st.name, v, srv.Version())
		}
		prev = v
		if n := names(got); !slices.Equal(n, []string{WorkersClusterName}) {
			t.Fatalf("%s: clusters %v, want only %s", st.name, n, WorkersClusterName)
		}
		c := got[WorkersClusterName]
		if eps := endpointAddrs(c); !slices.Equal(eps, st.want) {
			t.Errorf("%s: endpoints %v, want %v", st.name, eps, st.want)
		}
		if c.GetType() != st.typ {
			t.Errorf("%s: cluster type %s, want %s", st.name, c.GetType(), st.typ)
		}
	}
}

func TestXDSRefusesBadSetsAndKeepsTheOldOne(t *testing.T) {
	srv, addr := startXDS(t, DefaultNodeID)
	good := []Worker{{"w0", "10.0.0.1:8000"}}
	if err := srv.SetWorkers(good); err != nil {
		t.Fatal(err)
	}
	before := srv.Version()
	bad := []struct {
		name    string
		workers []Worker
	}{
		{"no port", []Worker{{"w0", "10.0.0.1:8000"}, {"w1", "10.0.0.1"}}},
		{"port zero", []Worker{{"w1", "10.0.0.1:0"}}},
		{"bad host", []Worker{{"w1", "a b:80"}}},
		{"control characters", []Worker{{"w1", "10.0.0.1\r\n:80"}}},
	}
	for _, b := range bad {
		if err := srv.SetWorkers(b.workers); err == nil {
			t.Errorf("%s: SetWorkers accepted %v", b.name, b.workers)
		}
	}
	if srv.Version() != before {
		t.Errorf("refused sets moved the version from %s to %s", before, srv.Version())
	}
	_, got := dialADS(t, addr, DefaultNodeID).next()
	if eps := endpointAddrs(got[WorkersClusterName]); !slices.Equal(eps, []string{"10.0.0.1:8000"}) {
		t.Errorf("after refused sets Envoy sees endpoints %v, want [10.0.0.1:8000]", eps)
	}
}

func TestXDSServesOnlyItsNodeUnlessAnyNode(t *testing.T) {
	workers := []Worker{{"w0", "10.0.0.1:8000"}}
	t.Run("named node: another node gets nothing", func(t *testing.T) {
		srv, addr := startXDS(t, DefaultNodeID)
		if err := srv.SetWorkers(workers); err != nil {
			t.Fatal(err)
		}
		other := dialADS(t, addr, "someone-else")
		got := make(chan error, 1)
		go func() { _, err := other.stream.Recv(); got <- err }()
		select {
		case err := <-got:
			t.Fatalf("node someone-else got a response (err %v); the server should answer only %s", err, DefaultNodeID)
		case <-time.After(300 * time.Millisecond):
		}
		if _, c := dialADS(t, addr, DefaultNodeID).next(); len(endpointAddrs(c[WorkersClusterName])) != 1 {
			t.Errorf("node %s got clusters %v, want %s with 1 endpoint", DefaultNodeID, names(c), WorkersClusterName)
		}
	})
	t.Run("empty node id serves every node", func(t *testing.T) {
		srv, addr := startXDS(t, "")
		if err := srv.SetWorkers(workers); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"envoy-7d9f-abc", "envoy-7d9f-def"} {
			if _, c := dialADS(t, addr, id).next(); len(endpointAddrs(c[WorkersClusterName])) != 1 {
				t.Errorf("node %s got clusters %v, want %s with 1 endpoint", id, names(c), WorkersClusterName)
			}
		}
	})
}

// The served cluster completes the xds bootstrap: put among its static
// clusters (where Envoy keeps it once CDS delivered it) it passes Validate's
// contract checks (override_host reads kvroute's list, circuit breakers),
// and the bootstrap's worker route names it.
func TestWorkersClusterCompletesXDSBootstrap(t *testing.T) {
	workers := []Worker{{"w0", "10.0.0.1:8000"}, {"w-dns", "vllm-0.vllm.default.svc:8000"}}
	yaml, err := Generate(StyleXDS, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseBootstrap(yaml)
	if err != nil {
		t.Fatal(err)
	}
	served, err := WorkersCluster(workers)
	if err != nil {
		t.Fatal(err)
	}
	b.StaticResources.Clusters = append(b.StaticResources.Clusters, served)
	if err := ValidateBootstrap(b); err != nil {
		t.Fatalf("xds bootstrap with the served cluster fails validation: %v", err)
	}
	if !slices.Contains(routeClusters(t, b), WorkersClusterName) {
		t.Errorf("xds bootstrap routes to %v, not to %s", routeClusters(t, b), WorkersClusterName)
	}
	// The same policy as cluster-header.yaml's worker clusters.
	ch, err := Generate(StyleClusterHeader, workers, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := ParseBootstrap(ch)
	if err != nil {
		t.Fatal(err)
	}
	static := staticClusters(cb)["w0"]
	if !proto.Equal(served.GetLoadBalancingPolicy(), static.GetLoadBalancingPolicy()) {
		t.Errorf("served load_balancing_policy\n%v\ndiffers from cluster-header.yaml's\n%v", served.GetLoadBalancingPolicy(), static.GetLoadBalancingPolicy())
	}
	if !proto.Equal(served.GetCircuitBreakers(), static.GetCircuitBreakers()) || !proto.Equal(served.GetConnectTimeout(), static.GetConnectTimeout()) {
		t.Errorf("served breakers/connect timeout differ from cluster-header.yaml's worker clusters")
	}
	if served.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("cluster with a host name endpoint is %s, want STRICT_DNS", served.GetType())
	}
}

// routeClusters lists the clusters the bootstrap's routes name.
func routeClusters(t *testing.T, b *bootstrapv3.Bootstrap) []string {
	t.Helper()
	views, err := ListenerViews(b)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range views {
		for _, vh := range v.HCM.GetRouteConfig().GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if c := r.GetRoute().GetCluster(); c != "" {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

func TestXDSServeStopsWithContext(t *testing.T) {
	srv := NewXDSServer("", nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	if err := srv.SetWorkers(nil); err != nil {
		t.Fatal(err)
	}
	ads := dialADS(t, lis.Addr().String(), "n")
	ads.next()
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve kept running with an open ADS stream after its context ended")
	}
	if _, err := ads.stream.Recv(); err == nil {
		t.Errorf("stream still delivers after Serve returned: %v", err)
	}
}

// FuzzWorkersCluster: any pair of workers either gives a cluster that
// passes Envoy's validation and holds each distinct address once, or a clear
// error; never a panic.
func FuzzWorkersCluster(f *testing.F) {
	for _, s := range [][3]string{
		{"w0", "10.0.0.1:8000", "10.0.0.2:8000"}, {"w1", "vllm-1.vllm.svc:8000", "10.0.0.1:8000"}, {"w2", "[::1]:8000", "[::1]:8000"},
		{"", "10.0.0.1:8000", "x:1"}, {"w3", "10.0.0.1", "10.0.0.1:1"}, {"w4", "10.0.0.1:99999", ""}, {"w5", "a b:1", "a:1"}, {"w6", ":80", "b:2"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, cluster, a1, a2 string) {
		c, err := WorkersCluster([]Worker{{Cluster: cluster, Address: a1}, {Cluster: cluster + "-2", Address: a2}})
		if err != nil {
			return
		}
		if err := c.ValidateAll(); err != nil {
			t.Fatalf("cluster for %q %q fails validation: %v", a1, a2, err)
		}
		if c.GetName() != WorkersClusterName || c.GetLoadAssignment().GetClusterName() != WorkersClusterName {
			t.Fatalf("cluster named %q, want %q", c.GetName(), WorkersClusterName)
		}
		want := 2
		h1, _ := parseHostPort("", a1)
		if h2, _ := parseHostPort("", a2); h1 == h2 {
			want = 1
		}
		if n := len(endpointAddrs(c)); n != want {
			t.Fatalf("addresses %q %q gave %d endpoints, want %d", a1, a2, n, want)
		}
	})
}

// BenchmarkSetWorkers measures one snapshot change for a fleet of 1,000
// workers: one cluster of 1,000 endpoints.
func BenchmarkSetWorkers(b *testing.B) {
	srv := NewXDSServer(DefaultNodeID, nil)
	workers := make([]Worker, 1000)
	for i := range workers {
		workers[i] = Worker{Cluster: "w" + strconv.Itoa(i), Address: "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + ":8000"}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := srv.SetWorkers(workers); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(workers)), "ns/worker")
}
