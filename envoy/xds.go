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
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// DefaultNodeID is the node id of the shipped bootstraps (Options.NodeID's default).
const DefaultNodeID = "kvroute-envoy"

// XDSServer serves the fleet's worker clusters to Envoy over ADS (the
// bootstrap of StyleXDS). Each worker becomes one cluster named by its
// Cluster with its Address as the only endpoint, configured as
// cluster-header.yaml configures its static worker clusters. SetWorkers
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

// SetWorkers replaces the served clusters with one per worker. An invalid
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
		c, err := WorkerCluster(w)
		if err != nil {
			return fmt.Errorf("envoy: xds: %w", err)
		}
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

// WorkerCluster builds the Envoy cluster for one worker, the same cluster
// cluster-header.yaml declares statically: STATIC for an IP literal,
// STRICT_DNS for a host name, a 5 s connect timeout, round robin over the
// single endpoint, and circuit breakers far above Envoy's default of 1,024.
func WorkerCluster(w Worker) (*clusterv3.Cluster, error) {
	hp, err := parseHostPort("worker "+w.Cluster+" address", w.Address)
	if err != nil {
		return nil, err
	}
	discovery := clusterv3.Cluster_STATIC
	if !hp.IsIP {
		discovery = clusterv3.Cluster_STRICT_DNS
	}
	limit := wrapperspb.UInt32(100000)
	c := &clusterv3.Cluster{
		Name:                 w.Cluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: discovery},
		ConnectTimeout:       durationpb.New(5 * time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			Priority:           corev3.RoutingPriority_DEFAULT,
			MaxConnections:     limit,
			MaxPendingRequests: limit,
			MaxRequests:        limit,
		}}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: w.Cluster,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
						Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
							Address:       hp.Host,
							PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(hp.Port)},
						}}},
					}},
				}},
			}},
		},
	}
	if err := c.ValidateAll(); err != nil {
		return nil, fmt.Errorf("cluster %q: %w", w.Cluster, err)
	}
	return c, nil
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
