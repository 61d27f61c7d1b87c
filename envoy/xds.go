package envoy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// DefaultNodeID is the node id of the shipped bootstraps (Options.NodeID's default).
const DefaultNodeID = "kvroute-envoy"

// XDSServer serves the fleet's worker clusters to Envoy over ADS (the
// bootstrap of StyleXDS). Each worker becomes one cluster named by its
// Cluster, with its Address at priority 0 and the other workers at
// priority 1 (where a retry goes), configured as cluster-header.yaml
// configures its static worker clusters (see WorkerClusters). SetWorkers
// replaces the whole set; Envoy sees clusters appear and disappear on its
// open ADS stream. The zero value is not usable; call NewXDSServer.
type XDSServer struct {
	nodeID string
	cache  cachev3.SnapshotCache
	log    *slog.Logger

	mu      sync.Mutex // serializes SetWorkers so versions follow call order
	version uint64
}

// NewXDSServer returns a server that answers the Envoy whose node id is
// nodeID, or every Envoy when nodeID is empty (useful when each replica's
// node id is its pod name). It serves an empty cluster set until the first
// SetWorkers.
func NewXDSServer(nodeID string, logger *slog.Logger) *XDSServer {
	if logger == nil {
		logger = slog.Default()
	}
	s := &XDSServer{nodeID: nodeID, log: logger}
	s.cache = cachev3.NewSnapshotCache(true, nodeKey{any: nodeID == ""}, nil)
	// An empty set is always valid, so this cannot fail; Envoy connecting
	// before the fleet is known gets no clusters rather than a hung request.
	if err := s.SetWorkers(nil); err != nil {
		logger.Error("xds initial snapshot", "err", err)
	}
	return s
}

// nodeKey is go-control-plane's NodeHash: the key a node's snapshot is kept
// under. With any set, every node shares the key "".
type nodeKey struct{ any bool }

func (k nodeKey) ID(node *corev3.Node) string {
	if k.any {
		return ""
	}
	return node.GetId()
}

// Version returns the version of the snapshot being served: "1" after
// construction, one more after each successful SetWorkers.
func (s *XDSServer) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.FormatUint(s.version, 10)
}

// SetWorkers replaces the served clusters with one per worker
// (WorkerClusters). An invalid
// set (empty or duplicate cluster names, a name the bootstrap reserves, a
// bad address) is refused as a whole and the previous set stays served.
func (s *XDSServer) SetWorkers(workers []Worker) error {
	clusters := make([]types.Resource, 0, len(workers))
	seen := map[string]bool{ExtProcClusterName: true, XDSClusterName: true, FallbackClusterName: true, OriginalDstClusterName: true}
	for _, w := range workers {
		if w.Cluster == "" {
			return fmt.Errorf("envoy: xds: worker at %q has no cluster name", w.Address)
		}
		if seen[w.Cluster] {
			return fmt.Errorf("envoy: xds: cluster name %q used twice or reserved", w.Cluster)
		}
		seen[w.Cluster] = true
	}
	cs, err := WorkerClusters(workers)
	if err != nil {
		return fmt.Errorf("envoy: xds: %w", err)
	}
	for _, c := range cs {
		clusters = append(clusters, c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	version := strconv.FormatUint(s.version+1, 10)
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ClusterType: clusters})
	if err != nil {
		return fmt.Errorf("envoy: xds: snapshot %s: %w", version, err)
	}
	if err := snap.Consistent(); err != nil {
		return fmt.Errorf("envoy: xds: snapshot %s: %w", version, err)
	}
	key := s.nodeID
	if err := s.cache.SetSnapshot(context.Background(), key, snap); err != nil {
		return fmt.Errorf("envoy: xds: set snapshot %s: %w", version, err)
	}
	s.version++
	s.log.Debug("xds snapshot", "version", version, "clusters", len(clusters))
	return nil
}

// WorkerCluster builds the Envoy cluster for one worker alone, as
// WorkerClusters does for a fleet of one.
func WorkerCluster(w Worker) (*clusterv3.Cluster, error) {
	return workerCluster(w, nil)
}

// WorkerClusters builds one cluster per worker, the same clusters
// cluster-header.yaml declares statically: STATIC for an IP literal,
// STRICT_DNS for a host name, a 5 s connect timeout, circuit breakers far
// above Envoy's default of 1,024, the worker as priority 0 and every other
// worker as priority 1, and override_host picking from kvroute's endpoint
// list (so a retry reaches kvroute's runner-up).
func WorkerClusters(workers []Worker) ([]*clusterv3.Cluster, error) {
	hps := make([]hostPort, len(workers))
	for i, w := range workers {
		hp, err := parseHostPort("worker "+w.Cluster+" address", w.Address)
		if err != nil {
			return nil, err
		}
		hps[i] = hp
	}
	out := make([]*clusterv3.Cluster, 0, len(workers))
	for i, w := range workers {
		var others []hostPort
		seen := map[hostPort]bool{hps[i]: true}
		for _, hp := range hps {
			if !seen[hp] {
				seen[hp] = true
				others = append(others, hp)
			}
		}
		c, err := workerCluster(w, others)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func workerCluster(w Worker, others []hostPort) (*clusterv3.Cluster, error) {
	hp, err := parseHostPort("worker "+w.Cluster+" address", w.Address)
	if err != nil {
		return nil, err
	}
	discovery := clusterv3.Cluster_STATIC
	if !hp.IsIP {
		discovery = clusterv3.Cluster_STRICT_DNS
	}
	for _, o := range others {
		if !o.IsIP {
			discovery = clusterv3.Cluster_STRICT_DNS
		}
	}
	limit := wrapperspb.UInt32(100000)
	endpoints := []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{lbEndpoint(hp)}}}
	if len(others) > 0 {
		p1 := &endpointv3.LocalityLbEndpoints{Priority: 1}
		for _, o := range others {
			p1.LbEndpoints = append(p1.LbEndpoints, lbEndpoint(o))
		}
		endpoints = append(endpoints, p1)
	}
	c := &clusterv3.Cluster{
		Name:                 w.Cluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: discovery},
		ConnectTimeout:       durationpb.New(5 * time.Second),
		LoadBalancingPolicy:  overrideHostPolicy(),
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			Priority:           corev3.RoutingPriority_DEFAULT,
			MaxConnections:     limit,
			MaxPendingRequests: limit,
			MaxRequests:        limit,
		}}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: w.Cluster, Endpoints: endpoints},
	}
	if err := c.ValidateAll(); err != nil {
		return nil, fmt.Errorf("cluster %q: %w", w.Cluster, err)
	}
	return c, nil
}

func lbEndpoint(hp hostPort) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address:       hp.Host,
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(hp.Port)},
			}}},
		}},
	}
}

// Names of the override_host policy as the bootstraps configure it.
const (
	// LBMetadataNamespace is the dynamic metadata namespace of the Gateway
	// API endpoint picker protocol.
	LBMetadataNamespace = "envoy.lb"
	// ServedKey is where override_host writes the endpoint it picked.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// overrideHostPolicy is the "override-host" template's policy as a proto.
func overrideHostPolicy() *clusterv3.LoadBalancingPolicy {
	rr, _ := anypb.New(&roundrobinv3.RoundRobin{})
	oh, _ := anypb.New(&overridehostv3.OverrideHost{
		OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{{
			Metadata: &metadatav3.MetadataKey{Key: LBMetadataNamespace, Path: []*metadatav3.MetadataKey_PathSegment{{
				Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: DestinationHeader}}}},
		}},
		SelectedHostKey: &metadatav3.MetadataKey{Key: LBMetadataNamespace, Path: []*metadatav3.MetadataKey_PathSegment{{
			Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: ServedKey}}}},
		FallbackPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.round_robin", TypedConfig: rr},
		}}},
	})
	return &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
		TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: OverrideHostPolicyName, TypedConfig: oh},
	}}}
}

// Serve answers ADS (and plain CDS) streams on lis until ctx is done, then
// stops gracefully, giving open streams a second before cutting them.
// It returns nil after ctx ends and the error of the gRPC server otherwise.
func (s *XDSServer) Serve(ctx context.Context, lis net.Listener) error {
	xds := serverv3.NewServer(ctx, s.cache, nil)
	gs := grpc.NewServer()
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(gs, xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(gs, xds)

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(time.Second):
			// ADS streams never end on their own: cut them.
			gs.Stop()
			<-stopped
		}
	}()
	s.log.Info("xds serving", "addr", lis.Addr().String(), "node_id", s.nodeID)
	err := gs.Serve(lis)
	close(done)
	wg.Wait()
	// After ctx ends, the owner may close lis before GracefulStop marks the
	// server stopped; Serve then sees its own listener's closing, which is
	// the shutdown it was asked for, not a failure.
	if ctx.Err() != nil && (err == nil || errors.Is(err, grpc.ErrServerStopped) || errors.Is(err, net.ErrClosed)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("envoy: xds serve %s: %w", lis.Addr(), err)
	}
	return nil
}
