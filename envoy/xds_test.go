package envoy

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

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

func TestXDSClustersFollowSetWorkers(t *testing.T) {
	srv, addr := startXDS(t, DefaultNodeID)
	ads := dialADS(t, addr, DefaultNodeID)

	v0, got := ads.next()
	if len(got) != 0 {
		t.Fatalf("before any SetWorkers: clusters %v, want none", names(got))
	}
	steps := []struct {
		name    string
		workers []Worker
		want    []string
	}{
		{"two workers appear", []Worker{{"w0", "10.0.0.1:8000"}, {"w1", "10.0.0.2:8000"}}, []string{"w0", "w1"}},
		{"a third joins", []Worker{{"w0", "10.0.0.1:8000"}, {"w1", "10.0.0.2:8000"}, {"w2", "vllm-2.vllm:8000"}}, []string{"w0", "w1", "w2"}},
		{"one leaves", []Worker{{"w0", "10.0.0.1:8000"}, {"w2", "vllm-2.vllm:8000"}}, []string{"w0", "w2"}},
		{"all leave", nil, nil},
	}
	prev := v0
	for _, st := range steps {
		if err := srv.SetWorkers(st.workers); err != nil {
			t.Fatalf("%s: SetWorkers: %v", st.name, err)
		}
		v, got := ads.next()
		if v == prev {
			t.Errorf("%s: version %q did not change", st.name, v)
		}
		if v != srv.Version() {
			t.Errorf("%s: response version %q, server version %q", st.name, v, srv.Version())
		}
		prev = v
		if n := names(got); !slices.Equal(n, st.want) {
			t.Fatalf("%s: clusters %v, want %v", st.name, n, st.want)
		}
		for _, w := range st.workers {
			ep := got[w.Cluster].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
			host, _, _ := net.SplitHostPort(w.Address)
			if ep.GetAddress() != host {
				t.Errorf("%s: cluster %s endpoint %s, want host %s", st.name, w.Cluster, ep.GetAddress(), host)
			}
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
		{"duplicate cluster", []Worker{{"w0", "10.0.0.1:8000"}, {"w0", "10.0.0.2:8000"}}},
		{"empty cluster name", []Worker{{"", "10.0.0.1:8000"}}},
		{"reserved ext_proc cluster", []Worker{{ExtProcClusterName, "10.0.0.1:8000"}}},
		{"reserved xds cluster", []Worker{{XDSClusterName, "10.0.0.1:8000"}}},
		{"no port", []Worker{{"w1", "10.0.0.1"}}},
		{"port zero", []Worker{{"w1", "10.0.0.1:0"}}},
		{"bad host", []Worker{{"w1", "a b:80"}}},
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
	if n := names(got); !slices.Equal(n, []string{"w0"}) {
		t.Errorf("after refused sets Envoy sees %v, want [w0]", n)
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
		if _, c := dialADS(t, addr, DefaultNodeID).next(); len(c) != 1 {
			t.Errorf("node %s got %d clusters, want 1", DefaultNodeID, len(c))
		}
	})
	t.Run("empty node id serves every node", func(t *testing.T) {
		srv, addr := startXDS(t, "")
		if err := srv.SetWorkers(workers); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"envoy-7d9f-abc", "envoy-7d9f-def"} {
			if _, c := dialADS(t, addr, id).next(); len(c) != 1 {
				t.Errorf("node %s got %d clusters, want 1", id, len(c))
			}
		}
	})
}

// The xDS cluster of a worker must be the very cluster cluster-header.yaml
// declares for it, so that switching styles changes nothing upstream.
func TestWorkerClusterMatchesClusterHeaderBootstrap(t *testing.T) {
	workers := []Worker{{"w0", "10.0.0.1:8000"}, {"w-dns", "vllm-0.vllm.default.svc:8000"}}
	yaml, err := Generate(StyleClusterHeader, workers, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseBootstrap(yaml)
	if err != nil {
		t.Fatal(err)
	}
	static := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		static[c.GetName()] = c
	}
	all, err := WorkerClusters(workers)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range workers {
		got := all[i]
		if !proto.Equal(got, static[w.Cluster]) {
			t.Errorf("xDS cluster %s\n%v\ndiffers from cluster-header.yaml's\n%v", w.Cluster, got, static[w.Cluster])
		}
	}
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

// FuzzWorkerCluster: any worker either gives a cluster that passes Envoy's
// validation and names the worker, or a clear error; never a panic.
func FuzzWorkerCluster(f *testing.F) {
	for _, s := range [][2]string{
		{"w0", "10.0.0.1:8000"}, {"w1", "vllm-1.vllm.svc:8000"}, {"w2", "[::1]:8000"},
		{"", "10.0.0.1:8000"}, {"w3", "10.0.0.1"}, {"w4", "10.0.0.1:99999"}, {"w5", "a b:1"}, {"w6", ":80"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, cluster, addr string) {
		c, err := WorkerCluster(Worker{Cluster: cluster, Address: addr})
		if err != nil {
			return
		}
		if err := c.ValidateAll(); err != nil {
			t.Fatalf("cluster for %q %q fails validation: %v", cluster, addr, err)
		}
		if c.GetName() != cluster || c.GetLoadAssignment().GetClusterName() != cluster {
			t.Fatalf("cluster named %q, want %q", c.GetName(), cluster)
		}
	})
}

// BenchmarkSetWorkers measures one snapshot change for a fleet of 1,000 workers.
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
