package server

import (
	"context"
	"net"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// cdsClient is Envoy's side of an ADS stream, reduced to CDS.
type cdsClient struct {
	t      *testing.T
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
}

func dialCDS(t *testing.T, addr string) *cdsClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &cdsClient{t: t, stream: stream, node: &corev3.Node{Id: envoy.DefaultNodeID, Cluster: "kvroute-gateway"}}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: c.node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	return c
}

// until ACKs CDS responses until one holds exactly the want clusters and
// returns them by name.
func (c *cdsClient) until(want ...string) map[string]*clusterv3.Cluster {
	c.t.Helper()
	sort.Strings(want)
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.t.Fatalf("ADS recv while waiting for clusters %v: %v", want, err)
		}
		got := map[string]*clusterv3.Cluster{}
		var names []string
		for _, a := range resp.GetResources() {
			var cl clusterv3.Cluster
			if err := a.UnmarshalTo(&cl); err != nil {
				c.t.Fatalf("unpack cluster: %v", err)
			}
			got[cl.GetName()] = &cl
			names = append(names, cl.GetName())
		}
		ack := &discoverygrpc.DiscoveryRequest{Node: c.node, TypeUrl: resource.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if err := c.stream.Send(ack); err != nil {
			c.t.Fatalf("ADS ack: %v", err)
		}
		sort.Strings(names)
		if slices.Equal(names, want) {
			return got
		}
	}
}

// untilEndpoints ACKs CDS responses until the one served cluster,
// kvroute_workers, holds exactly the want endpoints (host:port).
func (c *cdsClient) untilEndpoints(want ...string) *clusterv3.Cluster {
	c.t.Helper()
	for {
		got := c.until(envoy.WorkersClusterName)[envoy.WorkersClusterName]
		var eps []string
		for _, le := range got.GetLoadAssignment().GetEndpoints() {
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				eps = append(eps, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
			}
		}
		if slices.Equal(eps, want) {
			return got
		}
	}
}

func TestXDSServesEtcdRegisteredWorkersAsClusters(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	cfg := testConfig(t)
	cfg.EtcdEndpoints, cfg.XDSAddr, cfg.HTTPAddr, cfg.AdminAddr = e.Endpoints, "127.0.0.1:0", "-", "-"
	r := start(t, cfg)
	ads := dialCDS(t, r.XDSAddr())
	ads.untilEndpoints() // no workers yet: the worker cluster with no endpoints

	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	rec := fleet.Worker{ID: "w7", Cluster: "vllm-7", Model: model, Address: "10.0.0.7:8000", BlockSize: 16, KVTotalBlocks: 100}
	reg, err := etcd.Register(context.Background(), cli, cfg.Namespace, rec, etcd.RegisterOptions{TTL: 10 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	// One cluster for the fleet (O(workers)), the worker as its endpoint.
	ads.untilEndpoints("10.0.0.7:8000")
	if err := reg.Close(); err != nil { // deregistration removes the endpoint
		t.Fatal(err)
	}
	ads.untilEndpoints()
}

func TestXDSWorkersOneClusterPerName(t *testing.T) {
	var warned []string
	warn := func(msg string, _ ...any) { warned = append(warned, msg) }
	recs := []fleet.Worker{
		{ID: "a-dp0", Cluster: "a", Address: "10.0.0.1:8000"},
		{ID: "a-dp1", Cluster: "a", Address: "10.0.0.1:8000"},
		{ID: "b", Address: "10.0.0.2:8000"},
		{ID: "c", Cluster: "a", Address: "10.0.0.3:8000"},
	}
	got := xdsWorkers(recs, warn)
	want := []envoy.Worker{{Cluster: "a", Address: "10.0.0.1:8000"}, {Cluster: "b", Address: "10.0.0.2:8000"}}
	if !slices.Equal(got, want) {
		t.Fatalf("workers %v, want %v", got, want)
	}
	if len(warned) != 1 {
		t.Errorf("%d warnings, want 1 for the conflicting address", len(warned))
	}
}
