package envoytest

import (
	"fmt"
	"github.com/kvroute/kvroute/envoy"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	earlyhmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// gatewayConfig is the part of a bootstrap the Gateway implements, checked
// and turned into plain values.
type gatewayConfig struct {
	// earlyRemove are the request headers the HCM's early header
	// mutations remove, before routing and before ext_proc.
	earlyRemove []string
	listenAddr  string
	bufferLimit int64
	routes      routeTable
	proc        procConfig
	clusters    map[string]*upstreamCluster
}

type procConfig struct {
	cluster          string
	target           string
	mode             *extprocv3.ProcessingMode
	failureModeAllow bool
	messageTimeout   time.Duration
	rules            mutationRules
	requestAttrs     []string
	responseAttrs    []string
	routeCache       extprocv3.ExternalProcessor_RouteCacheAction
	sendBodyEarly    bool // send_body_without_waiting_for_header_response
	deferredClose    time.Duration
	// forwardSubsetHint: metadata_options forwards envoy.lb.subset_hint.
	forwardSubsetHint bool
	// forwardLB: metadata_options forwards envoy.lb (the endpoint list and
	// the endpoint override_host selected).
	forwardLB bool
	// receive are the untyped namespaces ext_proc may write.
	receive []string
}

// onlyFields fails when msg sets a field outside allowed: the Gateway would
// otherwise silently behave unlike Envoy.
func onlyFields(msg proto.Message, where string, allowed ...string) error {
	var bad []string
	msg.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !slices.Contains(allowed, string(fd.Name())) {
			bad = append(bad, string(fd.Name()))
		}
		return true
	})
	if len(bad) > 0 {
		return fmt.Errorf("envoy gateway: %s: field(s) %v are not supported by the Gateway", where, bad)
	}
	return nil
}

// buildGatewayConfig turns a validated bootstrap into the Gateway's config,
// refusing anything the Gateway does not implement.
func buildGatewayConfig(b *bootstrapv3.Bootstrap, opts GatewayOptions) (*gatewayConfig, error) {
	if err := onlyFields(b, "bootstrap", "node", "admin", "static_resources", "dynamic_resources"); err != nil {
		return nil, err
	}
	if err := onlyFields(b.GetStaticResources(), "static_resources", "listeners", "clusters"); err != nil {
		return nil, err
	}
	views, err := envoy.ListenerViews(b)
	if err != nil {
		return nil, fmt.Errorf("envoy gateway: %w", err)
	}
	if len(views) != 1 {
		return nil, fmt.Errorf("envoy gateway: want exactly one listener, have %d", len(views))
	}
	v := views[0]
	cfg := &gatewayConfig{bufferLimit: 1 << 20, clusters: map[string]*upstreamCluster{}}
	if err := onlyFields(v.Listener, "listener", "name", "address", "filter_chains", "per_connection_buffer_limit_bytes"); err != nil {
		return nil, err
	}
	if err := onlyFields(v.Listener.GetFilterChains()[0], "filter chain", "filters"); err != nil {
		return nil, err
	}
	if l := v.Listener.GetPerConnectionBufferLimitBytes(); l != nil {
		cfg.bufferLimit = int64(l.GetValue())
	}
	cfg.listenAddr = opts.ListenAddress
	if cfg.listenAddr == "" {
		sa := v.Listener.GetAddress().GetSocketAddress()
		cfg.listenAddr = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	}
	// Accepted and not enforced: the timeouts are long and the Gateway is
	// not a production proxy.
	if err := onlyFields(v.HCM, "http_connection_manager", "stat_prefix", "codec_type", "request_timeout",
		"stream_idle_timeout", "route_config", "http_filters", "early_header_mutation_extensions"); err != nil {
		return nil, err
	}
	for _, ext := range v.HCM.GetEarlyHeaderMutationExtensions() {
		var hm earlyhmv3.HeaderMutation
		if ext.GetTypedConfig() == nil || ext.GetTypedConfig().UnmarshalTo(&hm) != nil {
			return nil, fmt.Errorf("envoy gateway: early header mutation %q is not header_mutation", ext.GetName())
		}
		for _, m := range hm.GetMutations() {
			if m.GetRemove() == "" {
				return nil, fmt.Errorf("envoy gateway: early header mutation %q: only remove is supported", ext.GetName())
			}
			cfg.earlyRemove = append(cfg.earlyRemove, strings.ToLower(m.GetRemove()))
		}
	}
	if len(v.Filters) != 2 || v.Filters[0].ExtProc == nil || !v.Filters[1].Router {
		return nil, fmt.Errorf("envoy gateway: http filters must be exactly [%s, %s]", envoy.ExtProcFilterName, envoy.RouterFilterName)
	}
	if cfg.routes, err = buildRoutes(v.HCM.GetRouteConfig()); err != nil {
		return nil, err
	}
	if cfg.proc, err = buildProc(v.Filters[0].ExtProc); err != nil {
		return nil, err
	}
	hasCDS := b.GetDynamicResources().GetCdsConfig() != nil
	for _, c := range b.GetStaticResources().GetClusters() {
		uc, err := buildCluster(c)
		if err != nil {
			return nil, err
		}
		cfg.clusters[uc.name] = uc
	}
	if len(opts.Clusters) > 0 && !hasCDS {
		return nil, fmt.Errorf("envoy gateway: clusters given, but the bootstrap takes none over CDS")
	}
	for _, c := range opts.Clusters {
		if _, ok := cfg.clusters[c.GetName()]; ok {
			return nil, fmt.Errorf("envoy gateway: CDS cluster %q clashes with a static cluster", c.GetName())
		}
		if err := c.ValidateAll(); err != nil {
			return nil, fmt.Errorf("envoy gateway: CDS cluster %q: %w", c.GetName(), err)
		}
		uc, err := buildCluster(c)
		if err != nil {
			return nil, err
		}
		cfg.clusters[uc.name] = uc
	}
	for name, eps := range opts.Endpoints {
		uc, ok := cfg.clusters[name]
		if !ok {
			if !hasCDS {
				return nil, fmt.Errorf("envoy gateway: endpoints given for cluster %q, which the bootstrap does not define", name)
			}
			if name == envoy.WorkersClusterName {
				// What kvroute's xDS server would deliver for xds.yaml.
				ws := make([]envoy.Worker, len(eps))
				for i, ep := range eps {
					ws[i] = envoy.Worker{Cluster: "endpoint-" + strconv.Itoa(i), Address: ep}
				}
				c, err := envoy.WorkersCluster(ws)
				if err != nil {
					return nil, fmt.Errorf("envoy gateway: endpoints for %s: %w", name, err)
				}
				if uc, err = buildCluster(c); err != nil {
					return nil, err
				}
			} else {
				uc = &upstreamCluster{name: name, kind: clusterStatic, connectTimeout: 5 * time.Second}
			}
			cfg.clusters[name] = uc
		}
		if uc.kind == clusterOriginalDst {
			return nil, fmt.Errorf("envoy gateway: cluster %q is ORIGINAL_DST and takes no endpoints", name)
		}
		if len(eps) == 0 {
			return nil, fmt.Errorf("envoy gateway: empty endpoint list for cluster %q", name)
		}
		uc.setEndpoints(slices.Clone(eps))
	}
	pc, ok := cfg.clusters[cfg.proc.cluster]
	if !ok || len(pc.endpoints) == 0 {
		return nil, fmt.Errorf("envoy gateway: ext_proc cluster %q has no endpoint", cfg.proc.cluster)
	}
	cfg.proc.target = pc.endpoints[0]
	return cfg, nil
}

func buildProc(ep *extprocv3.ExternalProcessor) (procConfig, error) {
	if err := onlyFields(ep, "ext_proc", "grpc_service", "failure_mode_allow", "processing_mode", "message_timeout",
		"mutation_rules", "request_attributes", "response_attributes", "stat_prefix", "disable_clear_route_cache", "route_cache_action",
		"send_body_without_waiting_for_header_response", "deferred_close_timeout", "metadata_options"); err != nil {
		return procConfig{}, err
	}
	if err := onlyFields(ep.GetGrpcService(), "ext_proc grpc_service", "envoy_grpc", "timeout"); err != nil {
		return procConfig{}, err
	}
	pc := procConfig{
		cluster:          ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(),
		failureModeAllow: ep.GetFailureModeAllow(),
		messageTimeout:   200 * time.Millisecond, // Envoy's default
		routeCache:       ep.GetRouteCacheAction(),
		sendBodyEarly:    ep.GetSendBodyWithoutWaitingForHeaderResponse(),
		deferredClose:    5 * time.Second,
		mode:             proto.Clone(ep.GetProcessingMode()).(*extprocv3.ProcessingMode),
	}
	if pc.mode == nil {
		pc.mode = &extprocv3.ProcessingMode{}
	}
	if ep.GetDisableClearRouteCache() {
		pc.routeCache = extprocv3.ExternalProcessor_RETAIN
	}
	if t := ep.GetMessageTimeout(); t != nil {
		pc.messageTimeout = t.AsDuration()
	}
	if t := ep.GetDeferredCloseTimeout(); t != nil {
		pc.deferredClose = t.AsDuration()
	}
	m := pc.mode
	if m.GetRequestHeaderMode() == extprocv3.ProcessingMode_SKIP {
		return pc, fmt.Errorf("envoy gateway: request_header_mode SKIP is not supported")
	}
	switch m.GetRequestBodyMode() {
	case extprocv3.ProcessingMode_NONE, extprocv3.ProcessingMode_BUFFERED, extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED:
	default:
		return pc, fmt.Errorf("envoy gateway: request_body_mode %s is not supported", m.GetRequestBodyMode())
	}
	switch m.GetResponseBodyMode() {
	case extprocv3.ProcessingMode_NONE, extprocv3.ProcessingMode_STREAMED, extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED:
	default:
		return pc, fmt.Errorf("envoy gateway: response_body_mode %s is not supported", m.GetResponseBodyMode())
	}
	if pc.sendBodyEarly && m.GetRequestBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return pc, fmt.Errorf("envoy gateway: send_body_without_waiting_for_header_response is only supported with FULL_DUPLEX_STREAMED")
	}
	if m.GetResponseBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED && m.GetResponseHeaderMode() == extprocv3.ProcessingMode_SKIP {
		return pc, fmt.Errorf("envoy gateway: FULL_DUPLEX_STREAMED response body with response_header_mode SKIP is not supported")
	}
	for _, a := range ep.GetRequestAttributes() {
		if !requestAttributes[a] {
			return pc, fmt.Errorf("envoy gateway: request attribute %q is not supported", a)
		}
	}
	for _, a := range ep.GetResponseAttributes() {
		if !responseAttributes[a] {
			return pc, fmt.Errorf("envoy gateway: response attribute %q is not supported", a)
		}
	}
	pc.requestAttrs, pc.responseAttrs = ep.GetRequestAttributes(), ep.GetResponseAttributes()
	if mo := ep.GetMetadataOptions(); mo != nil {
		if err := onlyFields(mo, "ext_proc metadata_options", "forwarding_namespaces", "receiving_namespaces"); err != nil {
			return pc, err
		}
		for _, ns := range []*extprocv3.MetadataOptions_MetadataNamespaces{mo.GetForwardingNamespaces(), mo.GetReceivingNamespaces()} {
			if err := onlyFields(ns, "ext_proc metadata namespaces", "untyped"); err != nil {
				return pc, err
			}
		}
		for _, n := range mo.GetForwardingNamespaces().GetUntyped() {
			switch n {
			case subsetHintNamespace:
				pc.forwardSubsetHint = true
			case envoy.LBMetadataNamespace:
				pc.forwardLB = true
			default:
				return pc, fmt.Errorf("envoy gateway: forwarding metadata namespace %q is not supported (only %s and %s)", n, subsetHintNamespace, envoy.LBMetadataNamespace)
			}
		}
		// Received namespaces are merged into the request's dynamic
		// metadata, where override_host reads them.
		pc.receive = mo.GetReceivingNamespaces().GetUntyped()
	}
	var err error
	pc.rules, err = buildRules(ep.GetMutationRules())
	return pc, err
}

// clearsRouteCache reports whether a request-path answer clears the route
// cache, as Envoy decides it: only an answer with a header mutation can, and
// route_cache_action CLEAR or RETAIN overrides the answer's flag.
func (pc *procConfig) clearsRouteCache(cr *extprocsvc.CommonResponse) bool {
	if cr.GetHeaderMutation() == nil {
		return false
	}
	switch pc.routeCache {
	case extprocv3.ExternalProcessor_CLEAR:
		return true
	case extprocv3.ExternalProcessor_RETAIN:
		return false
	}
	return cr.GetClearRouteCache()
}

func buildRules(r *mutationv3.HeaderMutationRules) (mutationRules, error) {
	m := mutationRules{
		allowAllRouting: r.GetAllowAllRouting().GetValue(),
		allowEnvoy:      r.GetAllowEnvoy().GetValue(),
		disallowSystem:  r.GetDisallowSystem().GetValue(),
		disallowAll:     r.GetDisallowAll().GetValue(),
		disallowIsError: r.GetDisallowIsError().GetValue(),
	}
	var err error
	compile := func(e interface{ GetRegex() string }) *regexp.Regexp {
		if e == nil || e.GetRegex() == "" || err != nil {
			return nil
		}
		var re *regexp.Regexp
		// Envoy's RegexMatcher matches the whole header name.
		re, err = regexp.Compile("^(?:" + e.GetRegex() + ")$")
		return re
	}
	if r.GetAllowExpression() != nil {
		m.allowExpr = compile(r.GetAllowExpression())
	}
	if r.GetDisallowExpression() != nil {
		m.disallowExpr = compile(r.GetDisallowExpression())
	}
	if err != nil {
		return m, fmt.Errorf("envoy gateway: mutation_rules: %w", err)
	}
	return m, nil
}

func buildCluster(c *clusterv3.Cluster) (*upstreamCluster, error) {
	where := fmt.Sprintf("cluster %q", c.GetName())
	// health_checks and circuit_breakers are accepted and not enforced: the
	// Gateway assumes every endpoint healthy and never sheds.
	if err := onlyFields(c, where, "name", "type", "connect_timeout", "lb_policy", "load_balancing_policy", "load_assignment",
		"original_dst_lb_config", "typed_extension_protocol_options", "http2_protocol_options",
		"health_checks", "circuit_breakers", "dns_lookup_family"); err != nil {
		return nil, err
	}
	uc := &upstreamCluster{name: c.GetName(), h2: envoy.SpeaksHTTP2(c), connectTimeout: 5 * time.Second}
	if t := c.GetConnectTimeout(); t != nil {
		uc.connectTimeout = t.AsDuration()
	}
	switch c.GetType() {
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
		uc.kind = clusterStatic
	case clusterv3.Cluster_ORIGINAL_DST:
		uc.kind = clusterOriginalDst
		od := c.GetOriginalDstLbConfig()
		if err := onlyFields(od, where+" original_dst_lb_config", "use_http_header", "http_header_name"); err != nil {
			return nil, err
		}
		if !od.GetUseHttpHeader() {
			return nil, fmt.Errorf("envoy gateway: %s: ORIGINAL_DST is only supported with use_http_header", where)
		}
		uc.headerName = od.GetHttpHeaderName()
		if uc.headerName == "" {
			uc.headerName = "x-envoy-original-dst-host"
		}
		return uc, nil
	default:
		return nil, fmt.Errorf("envoy gateway: %s: type %s is not supported", where, c.GetType())
	}
	if err := buildLBPolicy(where, c, uc); err != nil {
		return nil, err
	}
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		if err := onlyFields(le, where+" locality endpoints", "lb_endpoints", "priority"); err != nil {
			return nil, err
		}
		pri := int(le.GetPriority())
		for len(uc.priorities) <= pri {
			uc.priorities = append(uc.priorities, nil)
		}
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			if sa == nil || sa.GetProtocol() != corev3.SocketAddress_TCP {
				return nil, fmt.Errorf("envoy gateway: %s: only TCP socket addresses are supported", where)
			}
			uc.priorities[pri] = append(uc.priorities[pri], net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
		}
	}
	if len(uc.priorities) > 0 {
		uc.endpoints = uc.priorities[0]
	}
	return uc, nil
}

func buildRoutes(rc *routev3.RouteConfiguration) (routeTable, error) {
	var t routeTable
	if err := onlyFields(rc, "route_config", "name", "virtual_hosts", "request_headers_to_remove", "validate_clusters"); err != nil {
		return t, err
	}
	t.remove = rc.GetRequestHeadersToRemove()
	for _, vh := range rc.GetVirtualHosts() {
		where := fmt.Sprintf("virtual host %q", vh.GetName())
		if err := onlyFields(vh, where, "name", "domains", "routes", "request_headers_to_remove"); err != nil {
			return t, err
		}
		v := virtualHost{domains: vh.GetDomains(), remove: vh.GetRequestHeadersToRemove()}
		for _, r := range vh.GetRoutes() {
			rt, err := buildRoute(where, r)
			if err != nil {
				return t, err
			}
			v.routes = append(v.routes, rt)
		}
		t.vhosts = append(t.vhosts, v)
	}
	return t, nil
}

func buildRoute(where string, r *routev3.Route) (route, error) {
	where = fmt.Sprintf("%s route %q", where, r.GetName())
	rt := route{name: r.GetName(), remove: r.GetRequestHeadersToRemove(), notFound: 503}
	if err := onlyFields(r, where, "name", "match", "route", "request_headers_to_remove"); err != nil {
		return rt, err
	}
	m := r.GetMatch()
	if err := onlyFields(m, where+" match", "prefix", "path", "headers"); err != nil {
		return rt, err
	}
	switch p := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		rt.prefix = p.Prefix
	case *routev3.RouteMatch_Path:
		rt.path, rt.exactPath = p.Path, true
	default:
		return rt, fmt.Errorf("envoy gateway: %s: only prefix and path matches are supported", where)
	}
	for _, hm := range m.GetHeaders() {
		if err := onlyFields(hm, where+" header match", "name", "present_match", "string_match", "invert_match"); err != nil {
			return rt, err
		}
		h := headerMatch{name: hm.GetName(), invert: hm.GetInvertMatch()}
		switch spec := hm.GetHeaderMatchSpecifier().(type) {
		case *routev3.HeaderMatcher_PresentMatch:
			h.present = spec.PresentMatch
		case *routev3.HeaderMatcher_StringMatch:
			if err := onlyFields(spec.StringMatch, where+" string_match", "exact"); err != nil {
				return rt, err
			}
			h.exact, h.hasExact = spec.StringMatch.GetExact(), true
		default:
			return rt, fmt.Errorf("envoy gateway: %s: header %q: only present_match and string_match.exact are supported", where, hm.GetName())
		}
		rt.headers = append(rt.headers, h)
	}
	ra := r.GetRoute()
	if err := onlyFields(ra, where+" action", "cluster", "cluster_header", "timeout", "cluster_not_found_response_code", "retry_policy"); err != nil {
		return rt, err
	}
	var err error
	if rt.retry, err = buildRetryPolicy(where, ra.GetRetryPolicy()); err != nil {
		return rt, err
	}
	rt.cluster, rt.clusterHeader = ra.GetCluster(), ra.GetClusterHeader()
	if ra.GetClusterNotFoundResponseCode() == routev3.RouteAction_NOT_FOUND {
		rt.notFound = 404
	} else if ra.GetClusterNotFoundResponseCode() == routev3.RouteAction_INTERNAL_SERVER_ERROR {
		rt.notFound = 500
	}
	rt.timeout = 15 * time.Second // Envoy's default route timeout
	if t := ra.GetTimeout(); t != nil {
		rt.timeout = t.AsDuration()
	}
	return rt, nil
}
