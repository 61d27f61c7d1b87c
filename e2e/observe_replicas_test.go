package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/server"
)

// Two kvroute replicas behind one Envoy, and the worst case for the
// default response path: every routing stream goes to replica A and every
// observing stream to replica B. B cannot match the reports and forwards
// them over NATS; A takes each one, so every request ends with its
// outcome seen by the replica that routed it.
func TestObservationReachesTheReplicaThatRouted(t *testing.T) {
	s := start(t, options{workers: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLong)
	defer cancel()
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.NATSURL, cfg.EtcdEndpoints = s.NATSURL, s.EtcdEndpoints
	cfg.ShutdownGrace = 2 * time.Second
	cfg.ReplicaSync, cfg.RouterID = true, "replica-b"
	b, err := server.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Shutdown() })
	eventually(t, "replica b to be ready", b.Ready)
	px, err := bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleClusterHeader, Workers: s.EnvoyWorkers(),
		ExtProcAddr: s.Router.GRPCAddr(), Edit: observeOn(b.GRPCAddr())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	c := bench.NewClient(px.URL())
	t.Cleanup(c.Close)
	const n = 6
	for i := range n {
		r := c.Do(ctx, &bench.Item{Path: bench.PathChat, Body: chat(longText(fmt.Sprintf("two replicas %d", i), 4), "q"), OutputLen: 8})
		if r.Err != nil {
			t.Fatalf("request %d: %v", i, r.Err)
		}
	}
	eventually(t, "every request to be freed on the replica that routed it", func() bool {
		return s.metric(t, "kvroute_requests_finished_total") == n
	})
	bURL := "http://" + b.HTTPAddr()
	if got := metricAt(t, bURL, "kvroute_extproc_observations_total", `matched="false"`); got != n {
		t.Errorf("replica b could not match %v reports, want all %d (it routed none)", got, n)
	}
	if got := s.metric(t, "kvroute_extproc_observations_total", `matched="true"`); got != n {
		t.Errorf("replica a took %v forwarded reports, want %d", got, n)
	}
	if got := s.metric(t, "kvroute_requests_finished_total", `outcome="ok"`); got != n {
		t.Errorf("%v requests ended ok on replica a, want %d", got, n)
	}
}

// observeOn points the observing ext_proc filter at another kvroute: a
// copy of the kvroute cluster with addr as its one endpoint.
func observeOn(addr string) func([]byte) ([]byte, error) {
	return func(data []byte) ([]byte, error) {
		data, err := bench.EditHCM(func(hcm *hcmv3.HttpConnectionManager) error {
			for _, f := range hcm.GetHttpFilters() {
				var ep extprocv3.ExternalProcessor
				if f.GetTypedConfig().UnmarshalTo(&ep) != nil || !ep.GetObservabilityMode() {
					continue
				}
				ep.GetGrpcService().GetEnvoyGrpc().ClusterName = "kvroute_b"
				if err := f.GetTypedConfig().MarshalFrom(&ep); err != nil {
					return err
				}
			}
			return nil
		})(data)
		if err != nil {
			return nil, err
		}
		bs, err := envoy.ParseBootstrap(data)
		if err != nil {
			return nil, err
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		p, _ := strconv.Atoi(port)
		for _, cl := range bs.GetStaticResources().GetClusters() {
			if cl.GetName() != envoy.ExtProcClusterName {
				continue
			}
			cb := proto.Clone(cl).(*clusterv3.Cluster)
			cb.Name = "kvroute_b"
			cb.LoadAssignment.ClusterName = "kvroute_b"
			sa := cb.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
			sa.Address = host
			sa.PortSpecifier = &corev3.SocketAddress_PortValue{PortValue: uint32(p)}
			bs.StaticResources.Clusters = append(bs.StaticResources.Clusters, cb)
			break
		}
		return protojson.Marshal(bs)
	}
}

// metricAt sums the samples of a metric at a /metrics URL whose lines
// contain every label.
func metricAt(t *testing.T, base, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var total float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		total += v
	}
	return total
}
