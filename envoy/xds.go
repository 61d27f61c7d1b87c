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

// XDSServer serves the fleet to Envoy over ADS (the bootstrap of
// StyleXDS) as ONE cluster, WorkersClusterName, holding every worker's
// address once and picking hosts with override_host from kvroute's endpoint
// list (see WorkersCluster). The snapshot is O(workers): a fleet of N
// workers is N endpoints, not N clusters of N endpoints each. SetWorkers
// replaces the whole set; Envoy sees the cluster's endpoints change on its
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
// node id is its pod name). It serves nothing until the first SetWorkers:
// an Envoy that connects before then keeps the clusters it has (a
// restarted router must not take an Envoy's hosts away before discovery
// has answered), and a new Envoy waits for the first set.
func NewXDSServer(nodeID string, logger *slog.Logger) *XDSServer {
	if logger == nil {
		logger = slog.Default()
	}
	s := &XDSServer{nodeID: nodeID, log: logger}
	s.cache = cachev3.NewSnapshotCache(true, nodeKey{any: nodeID == ""}, nil)
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

// Version returns the version of the snapshot being served: "0" before
// the first SetWorkers, one more after each successful one.
func (s *XDSServer) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.FormatUint(s.version, 10)
}

// SetWorkers replaces the served worker cluster with one holding these
// workers (WorkersCluster). An invalid set (a bad address) is refused as a
// whole and the previous set stays served. Cluster names play no part: the
// xds bootstrap routes to WorkersClusterName and override_host matches
// kvroute's list by address.
func (s *XDSServer) SetWorkers(workers []Worker) error {
	c, err := WorkersCluster(workers)
	if err != nil {
		return fmt.Errorf("envoy: xds: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	version := strconv.FormatUint(s.version+1, 10)
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ClusterType: {c}})
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
	s.log.Debug("xds snapshot", "version", version, "cluster", c.GetName(),
		"endpoints", len(c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()))
	return nil
}

// WorkersCluster builds the one cluster the xds style routes to,
// WorkersClusterName: every distinct worker address once, at priority 0, in
// the order given; STATIC when all are IP literals, STRICT_DNS otherwise; a
// 5 s connect timeout and circuit breakers far above Envoy's default of
// 1,024, as cluster-header.yaml's worker clusters have. Its policy is
// override_host reading kvroute's endpoint list from envoy.lb metadata: the
// first attempt goes to kvroute's pick, a retry (the route's previous_hosts
// predicate) to the next listed endpoint, kvroute's runner-up. Without a
// list, or once the list is used up, the fallback is round robin over every
// worker (see overrideHostPolicy). No workers gives the cluster with no
// endpoints.
func WorkersCluster(workers []Worker) (*clusterv3.Cluster, error) {
	discovery := clusterv3.Cluster_STATIC
	lbs := make([]*endpointv3.LbEndpoint, 0, len(workers))
	seen := make(map[hostPort]bool, len(workers))
	for _, w := range workers {
		hp, err := parseHostPort("worker "+w.Cluster+" address", w.Address)
		if err != nil {
			return nil, err
		}
		if seen[hp] { // data-parallel ranks behind one address: Envoy keys hosts by address
			continue
		}
		seen[hp] = true
		if !hp.IsIP { // a STATIC cluster takes IP literals only
			discovery = clusterv3.Cluster_STRICT_DNS
		}
		lbs = append(lbs, lbEndpoint(hp))
	}
	limit := wrapperspb.UInt32(100000)
	c := &clusterv3.Cluster{
		Name:                 WorkersClusterName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: discovery},
		ConnectTimeout:       durationpb.New(5 * time.Second),
		LoadBalancingPolicy:  overrideHostPolicy(),
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			Priority:           corev3.RoutingPriority_DEFAULT,
			MaxConnections:     limit,
			MaxPendingRequests: limit,
			MaxRequests:        limit,
		}}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: WorkersClusterName,
			Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}},
		},
	}
	if err := c.ValidateAll(); err != nil {
		return nil, fmt.Errorf("cluster %q: %w", WorkersClusterName, err)
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

// overrideHostPolicy is the "override-host" template's policy as a proto:
// override_host over kvroute's list, round robin as the fallback. The
// fallback picks a retry's host once kvroute's list is used up (the
// previous_hosts predicate keeps it off the failed host), a request kvroute
// answered without a list, and every request while kvroute is unreachable
// (the xds bootstrap fails open). Round robin rather than least_request:
// fail-open traffic spreads evenly, which the e2e tests check through
// Envoy itself.
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
