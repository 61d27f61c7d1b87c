package envoy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/proto"
)

// minBreaker is the circuit-breaker floor: Envoy's default of 1,024 would cap
// the fleet's concurrent requests and kvroute's ext_proc streams.
const minBreaker = 1024

// minLongTimeout is the shortest route or idle timeout that still fits a long
// generation (0 disables the timeout, which is fine too).
const minLongTimeout = 5 * time.Minute

// Validate parses a bootstrap and checks it the way Envoy would before
// serving it, plus the properties kvroute relies on:
//   - protojson decoding into bootstrap.Bootstrap (unknown fields fail);
//   - protoc-gen-validate rules on the bootstrap and on every message packed
//     in an Any (Bootstrap.ValidateAll does not look inside Any);
//   - Envoy's semantic rules: FULL_DUPLEX_STREAMED needs trailers SEND and
//     no failure_mode_allow, ext_proc has one of grpc_service and http_service,
//     ORIGINAL_DST needs CLUSTER_PROVIDED and no load assignment, every
//     referenced cluster exists, the ext_proc and ADS clusters speak HTTP/2;
//   - kvroute's contract: header names x-target-worker and
//     x-gateway-destination-endpoint, both removed from the client's request
//     by an early header mutation (before ext_proc), x-target-worker removed
//     before the worker sees it, message_timeout set, gRPC health checking of kvroute,
//     circuit breakers above 1,024 and timeouts fit for long generations;
//   - routes to worker clusters (cluster_header, or the shared
//     kvroute_workers cluster) retry connect-failure at least once, retry_on
//     names only conditions Envoy knows, and an override_host policy reads
//     kvroute's endpoint list;
//   - a bootstrap that takes clusters over ADS (style xds) routes to
//     kvroute_workers, the one cluster kvroute serves, and never by
//     cluster_header (kvroute serves no per-worker clusters), with
//     validate_clusters: false (the cluster arrives after the listener
//     loads); a static bootstrap must define every cluster it routes to.
//
// All failures are reported together.
func Validate(data []byte) (*bootstrapv3.Bootstrap, error) {
	b, err := ParseBootstrap(data)
	if err != nil {
		return nil, err
	}
	if err := ValidateBootstrap(b); err != nil {
		return nil, err
	}
	return b, nil
}

// ValidateBootstrap runs Validate's checks on an already decoded bootstrap.
func ValidateBootstrap(b *bootstrapv3.Bootstrap) error {
	if err := b.ValidateAll(); err != nil {
		return fmt.Errorf("envoy: bootstrap: %w", err)
	}
	err := walkAny(b.ProtoReflect(), "bootstrap", func(path string, m proto.Message) error {
		if v, ok := m.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("envoy: %w", err)
	}
	views, err := ListenerViews(b)
	if err != nil {
		return fmt.Errorf("envoy: %w", err)
	}
	c := &checker{clusters: staticClusters(b), ads: b.GetDynamicResources().GetCdsConfig().GetAds() != nil}
	c.checkClusters(b)
	c.checkADS(b)
	for _, v := range views {
		c.checkListener(v)
	}
	if len(c.errs) > 0 {
		return fmt.Errorf("envoy: bootstrap fails %d check(s): %w", len(c.errs), errors.Join(c.errs...))
	}
	return nil
}

type checker struct {
	clusters map[string]*clusterv3.Cluster
	// ads: clusters also come over ADS from kvroute, which serves exactly
	// WorkersClusterName.
	ads  bool
	errs []error
}

func (c *checker) failf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

func (c *checker) checkClusters(b *bootstrapv3.Bootstrap) {
	for _, cl := range b.GetStaticResources().GetClusters() {
		name := cl.GetName()
		if cl.GetType() == clusterv3.Cluster_ORIGINAL_DST {
			if cl.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
				c.failf("cluster %q: ORIGINAL_DST needs lb_policy CLUSTER_PROVIDED, not %s", name, cl.GetLbPolicy())
			}
			if cl.GetLoadAssignment() != nil {
				c.failf("cluster %q: ORIGINAL_DST clusters must have no load_assignment", name)
			}
			od := cl.GetOriginalDstLbConfig()
			if !od.GetUseHttpHeader() {
				c.failf("cluster %q: ORIGINAL_DST must route on the %s header (use_http_header: true)", name, DestinationHeader)
			} else if od.GetHttpHeaderName() != DestinationHeader {
				c.failf("cluster %q: http_header_name is %q, kvroute writes %q", name, od.GetHttpHeaderName(), DestinationHeader)
			}
		} else if cl.GetLbPolicy() == clusterv3.Cluster_CLUSTER_PROVIDED {
			c.failf("cluster %q: lb_policy CLUSTER_PROVIDED needs a cluster type that provides one (ORIGINAL_DST)", name)
		}
		if od := cl.GetOriginalDstLbConfig(); od.GetHttpHeaderName() != "" && !od.GetUseHttpHeader() {
			c.failf("cluster %q: http_header_name is set but use_http_header is false", name)
		}
		c.checkOverrideHost(cl)
		if !breakersRaised(cl) {
			c.failf("cluster %q: circuit breakers must raise max_connections, max_pending_requests and max_requests above %d", name, minBreaker)
		}
	}
}

func breakersRaised(cl *clusterv3.Cluster) bool {
	for _, t := range cl.GetCircuitBreakers().GetThresholds() {
		if t.GetPriority() != 0 { // DEFAULT priority carries the traffic
			continue
		}
		if t.GetMaxConnections().GetValue() > minBreaker &&
			t.GetMaxPendingRequests().GetValue() > minBreaker &&
			t.GetMaxRequests().GetValue() > minBreaker {
			return true
		}
	}
	return false
}

// checkGrpcCluster checks a cluster Envoy reaches over gRPC (kvroute's ext_proc or ADS).
func (c *checker) checkGrpcCluster(role, name string, wantHealthCheck bool) {
	if name == "" {
		c.failf("%s: must use envoy_grpc with a cluster_name", role)
		return
	}
	cl, ok := c.clusters[name]
	if !ok {
		c.failf("%s: cluster %q does not exist among the static clusters", role, name)
		return
	}
	if !SpeaksHTTP2(cl) {
		c.failf("%s: cluster %q must speak HTTP/2 (explicit_http_config.http2_protocol_options)", role, name)
	}
	if wantHealthCheck && !slices.ContainsFunc(cl.GetHealthChecks(), func(h *corev3.HealthCheck) bool { return h.GetGrpcHealthCheck() != nil }) {
		c.failf("%s: cluster %q needs a gRPC health check", role, name)
	}
}

func (c *checker) checkADS(b *bootstrapv3.Bootstrap) {
	dr := b.GetDynamicResources()
	if dr == nil {
		return
	}
	if dr.GetAdsConfig() == nil {
		c.failf("dynamic_resources: only ADS from kvroute is supported (ads_config missing)")
		return
	}
	services := dr.GetAdsConfig().GetGrpcServices()
	if len(services) == 0 {
		c.failf("dynamic_resources.ads_config: needs a grpc_services entry pointing at kvroute")
	}
	for _, g := range services {
		c.checkGrpcCluster("ADS", envoyGrpcCluster(g), false)
	}
	if dr.GetCdsConfig().GetAds() == nil {
		c.failf("dynamic_resources.cds_config: clusters must come over ADS (ads: {})")
	}
}

func (c *checker) checkListener(v ListenerView) {
	where := fmt.Sprintf("listener %q", v.Listener.GetName())
	ep := v.ExtProcConfig()
	if ep == nil {
		c.failf("%s: has no %s filter", where, ExtProcFilterName)
	} else {
		c.checkExtProc(where, ep)
	}
	if n := len(v.Filters); n == 0 || !v.Filters[n-1].Router {
		c.failf("%s: the last http filter must be %s", where, RouterFilterName)
	}
	c.checkFilterOrder(where, v.Filters)
	if t := v.HCM.GetStreamIdleTimeout(); t == nil || !longEnough(t.AsDuration()) {
		c.failf("%s: stream_idle_timeout must be set to 0 or at least %v for long generations", where, minLongTimeout)
	}
	// A fail-open ext_proc (or one that answers nothing) leaves the
	// client's own routing headers in place unless they go first.
	early, err := v.EarlyRemovedHeaders()
	if err != nil {
		c.failf("%s: %v", where, err)
	}
	for _, h := range []string{TargetHeader, DestinationHeader} {
		if !slices.Contains(early, h) {
			c.failf("%s: %s must be removed by an early header mutation (before ext_proc), so a client cannot steer a request kvroute did not answer", where, h)
		}
	}
	rc := v.HCM.GetRouteConfig()
	if rc == nil {
		c.failf("%s: needs a static route_config", where)
		return
	}
	c.checkRoutes(where, rc)
}

func (c *checker) checkExtProc(where string, ep *extprocv3.ExternalProcessor) {
	c.checkGrpcCluster(where+": ext_proc", envoyGrpcCluster(ep.GetGrpcService()), true)
	pm := ep.GetProcessingMode()
	if pm.GetRequestBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED && pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
		c.failf("%s: ext_proc request_body_mode FULL_DUPLEX_STREAMED needs request_trailer_mode SEND", where)
	}
	if pm.GetResponseBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED && pm.GetResponseTrailerMode() != extprocv3.ProcessingMode_SEND {
		c.failf("%s: ext_proc response_body_mode FULL_DUPLEX_STREAMED needs response_trailer_mode SEND", where)
	}
	duplex := pm.GetRequestBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		pm.GetResponseBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if duplex && ep.GetFailureModeAllow() {
		c.failf("%s: ext_proc failure_mode_allow must stay false with FULL_DUPLEX_STREAMED (kvroute's streamed-body bootstraps fail closed)", where)
	}
	if (ep.GetGrpcService() == nil) == (ep.GetHttpService() == nil) {
		c.failf("%s: ext_proc needs exactly one of grpc_service and http_service", where)
	}
	if ep.GetDisableClearRouteCache() && ep.GetRouteCacheAction() != extprocv3.ExternalProcessor_DEFAULT {
		c.failf("%s: ext_proc disable_clear_route_cache and route_cache_action cannot both be set", where)
	}
	if ep.GetMessageTimeout() == nil {
		c.failf("%s: ext_proc message_timeout must be set (Envoy's 200ms default is shorter than kvroute's queue)", where)
	}
}

// checkFilterOrder checks what the one-exchange layout needs of the filter
// chain: a routing ext_proc that skips the request headers lets them on at
// once, so a buffer filter after it must hold the request until kvroute's
// answer to the body is in (without one, Envoy picks the route and the
// host before kvroute answers); an observing ext_proc must fail open, as
// nothing of the request depends on it.
func (c *checker) checkFilterOrder(where string, fs []HTTPFilter) {
	routing := -1
	for i, f := range fs {
		switch {
		case f.ExtProc != nil && f.ExtProc.GetObservabilityMode():
			if !f.ExtProc.GetFailureModeAllow() {
				c.failf("%s: the observing ext_proc filter %q must set failure_mode_allow: true (no request depends on it)", where, f.Name)
			}
		case f.ExtProc != nil && routing < 0:
			routing = i
		}
	}
	if routing < 0 {
		return
	}
	pm := fs[routing].ExtProc.GetProcessingMode()
	if pm.GetRequestHeaderMode() != extprocv3.ProcessingMode_SKIP {
		return
	}
	if !slices.ContainsFunc(fs[routing+1:], func(f HTTPFilter) bool { return f.Buffer }) {
		c.failf("%s: ext_proc skips the request headers, so a buffer filter (envoy.filters.http.buffer) must follow it to hold the request until kvroute has answered the body", where)
	}
}

func (c *checker) checkRoutes(where string, rc *routev3.RouteConfiguration) {
	stripped := slices.Contains(rc.GetRequestHeadersToRemove(), TargetHeader)
	for _, vh := range rc.GetVirtualHosts() {
		vhStripped := stripped || slices.Contains(vh.GetRequestHeadersToRemove(), TargetHeader)
		for _, r := range vh.GetRoutes() {
			rw := fmt.Sprintf("%s: route %q", where, r.GetName())
			ra := r.GetRoute()
			if ra == nil {
				c.failf("%s: only route actions (no redirects or direct responses) are expected", rw)
				continue
			}
			if !vhStripped && !slices.Contains(r.GetRequestHeadersToRemove(), TargetHeader) {
				c.failf("%s: %s must be in request_headers_to_remove so it never reaches the worker", rw, TargetHeader)
			}
			if t := ra.GetTimeout(); t == nil || !longEnough(t.AsDuration()) {
				c.failf("%s: timeout must be set to 0 or at least %v (Envoy's 15s default cuts generations short)", rw, minLongTimeout)
			}
			for _, dm := range r.GetMatch().GetDynamicMetadata() {
				if p := dm.GetPath(); dm.GetFilter() != "envoy.lb" || len(p) != 1 || p[0].GetKey() != TargetHeader {
					c.failf("%s: a route picked by metadata routes on envoy.lb %s, which kvroute writes", rw, TargetHeader)
				}
			}
			switch spec := ra.GetClusterSpecifier().(type) {
			case *routev3.RouteAction_Cluster:
				cl, static := c.clusters[spec.Cluster]
				switch {
				case static && takesEndpointList(cl) && !retriesConnectFailure(ra.GetRetryPolicy()):
					c.failf("%s: a route to a worker cluster that takes kvroute's endpoint list needs a retry_policy with retry_on connect-failure and num_retries >= 1", rw)
				case spec.Cluster == WorkersClusterName && c.ads && !static:
					// Served by kvroute over ADS: the route to the workers.
					// Envoy checks a static route table's clusters when the
					// listener loads (validate_clusters defaults to true
					// there), before CDS has delivered this one.
					if vc := rc.GetValidateClusters(); vc == nil || vc.GetValue() {
						c.failf("%s: cluster %q comes over CDS after the listener loads: the route_config needs validate_clusters: false, or Envoy refuses it as an unknown cluster", rw, spec.Cluster)
					}
					if !retriesConnectFailure(ra.GetRetryPolicy()) {
						c.failf("%s: a route to kvroute's worker cluster needs a retry_policy with retry_on connect-failure and num_retries >= 1", rw)
					}
				case !static && c.ads:
					c.failf("%s: cluster %q is neither static nor served by kvroute over ADS (kvroute serves only %q)", rw, spec.Cluster, WorkersClusterName)
				case !static:
					c.failf("%s: cluster %q does not exist among the static clusters", rw, spec.Cluster)
				}
			case *routev3.RouteAction_ClusterHeader:
				if c.ads {
					c.failf("%s: kvroute's xDS server serves one worker cluster, %q, and no per-worker clusters: route with cluster: %s, not cluster_header", rw, WorkersClusterName, WorkersClusterName)
				}
				if spec.ClusterHeader != TargetHeader {
					c.failf("%s: cluster_header is %q, kvroute writes %q", rw, spec.ClusterHeader, TargetHeader)
				}
				// kvroute's contract: a worker that refuses the connection
				// costs no client error, the request goes to the runner-up.
				if !retriesConnectFailure(ra.GetRetryPolicy()) {
					c.failf("%s: a route to kvroute's worker clusters needs a retry_policy with retry_on connect-failure and num_retries >= 1", rw)
				}
			default:
				c.failf("%s: route by cluster or cluster_header, not %T", rw, spec)
			}
			if rp := ra.GetRetryPolicy(); rp != nil {
				for _, on := range strings.Split(rp.GetRetryOn(), ",") {
					if on = strings.TrimSpace(on); on != "" && !envoyRetryOn[on] {
						c.failf("%s: retry_on %q is not a condition Envoy knows", rw, on)
					}
				}
			}
		}
	}
}

// envoyRetryOn are the x-envoy-retry-on and x-envoy-retry-grpc-on
// conditions Envoy accepts in a route's retry_on.
var envoyRetryOn = map[string]bool{
	"5xx": true, "gateway-error": true, "reset": true, "reset-before-request": true, "connect-failure": true,
	"envoy-ratelimited": true, "retriable-4xx": true, "refused-stream": true, "retriable-status-codes": true,
	"retriable-headers": true, "http3-post-connect-failure": true,
	"cancelled": true, "deadline-exceeded": true, "internal": true, "resource-exhausted": true, "unavailable": true,
}

// retriesConnectFailure reports whether rp retries a refused connection.
func retriesConnectFailure(rp *routev3.RetryPolicy) bool {
	if rp.GetNumRetries() != nil && rp.GetNumRetries().GetValue() < 1 {
		return false // Envoy's default is 1 when num_retries is unset
	}
	for _, on := range strings.Split(rp.GetRetryOn(), ",") {
		if strings.TrimSpace(on) == "connect-failure" {
			return true
		}
	}
	return false
}

// checkOverrideHost checks a cluster's override_host policy the way Envoy
// loads it (each source names exactly one of header and metadata) and that
// it reads kvroute's endpoint list.
// takesEndpointList reports whether the cluster's load balancing policy is
// override_host (kvroute's endpoint list, one host per attempt).
func takesEndpointList(cl *clusterv3.Cluster) bool {
	for _, p := range cl.GetLoadBalancingPolicy().GetPolicies() {
		if tc := p.GetTypedExtensionConfig().GetTypedConfig(); tc != nil && tc.MessageIs(&overridehostv3.OverrideHost{}) {
			return true
		}
	}
	return false
}

func (c *checker) checkOverrideHost(cl *clusterv3.Cluster) {
	for _, p := range cl.GetLoadBalancingPolicy().GetPolicies() {
		tc := p.GetTypedExtensionConfig().GetTypedConfig()
		var oh overridehostv3.OverrideHost
		if tc == nil || !tc.MessageIs(&oh) {
			continue
		}
		if err := tc.UnmarshalTo(&oh); err != nil {
			c.failf("cluster %q: override_host: %v", cl.GetName(), err)
			continue
		}
		readsList := false
		for i, src := range oh.GetOverrideHostSources() {
			hasHeader, hasMeta := src.GetHeader() != "", src.GetMetadata() != nil
			if hasHeader == hasMeta {
				c.failf("cluster %q: override_host source %d must set exactly one of header and metadata", cl.GetName(), i)
			}
			readsList = readsList || strings.EqualFold(src.GetHeader(), DestinationHeader) ||
				isLBKey(src.GetMetadata(), DestinationHeader)
		}
		if !readsList {
			c.failf("cluster %q: override_host must read kvroute's endpoint list (%s header or %s metadata)", cl.GetName(), DestinationHeader, LBMetadataNamespace)
		}
	}
}

// isLBKey reports whether k is envoy.lb/<key>.
func isLBKey(k *metadatav3.MetadataKey, key string) bool {
	return k.GetKey() == LBMetadataNamespace && len(k.GetPath()) == 1 && k.GetPath()[0].GetKey() == key
}

func longEnough(d time.Duration) bool { return d == 0 || d >= minLongTimeout }
