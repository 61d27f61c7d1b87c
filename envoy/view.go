package envoy

import (
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// Filter names as the bootstraps spell them.
const (
	hcmFilterName     = "envoy.filters.network.http_connection_manager"
	extProcFilterName = "envoy.filters.http.ext_proc"
	routerFilterName  = "envoy.filters.http.router"
	httpOptionsKey    = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// httpFilter is one entry of an HCM filter chain with its config unpacked.
type httpFilter struct {
	name    string
	extProc *extprocv3.ExternalProcessor // set for the ext_proc filter
	router  bool                         // the terminal router filter
}

// listenerView is a listener with the parts kvroute cares about unpacked
// from their Any wrappers.
type listenerView struct {
	listener *listenerv3.Listener
	hcm      *hcmv3.HttpConnectionManager
	filters  []httpFilter
}

// extProc returns the listener's ext_proc filter config, or nil.
func (v listenerView) extProc() *extprocv3.ExternalProcessor {
	for _, f := range v.filters {
		if f.extProc != nil {
			return f.extProc
		}
	}
	return nil
}

// listenerViews unpacks the HTTP connection manager and its HTTP filters of
// every static listener. A listener without an HCM is an error: every
// bootstrap kvroute ships is an HTTP proxy.
func listenerViews(b *bootstrapv3.Bootstrap) ([]listenerView, error) {
	var out []listenerView
	for i, l := range b.GetStaticResources().GetListeners() {
		where := fmt.Sprintf("listener %q", l.GetName())
		if len(l.GetFilterChains()) != 1 || len(l.GetFilterChains()[0].GetFilters()) != 1 {
			return nil, fmt.Errorf("%s: want exactly one filter chain with one network filter (%s)", where, hcmFilterName)
		}
		nf := l.GetFilterChains()[0].GetFilters()[0]
		var hcm hcmv3.HttpConnectionManager
		if nf.GetTypedConfig() == nil || nf.GetTypedConfig().UnmarshalTo(&hcm) != nil {
			return nil, fmt.Errorf("%s: network filter %q is not an %s", where, nf.GetName(), hcmFilterName)
		}
		v := listenerView{listener: b.GetStaticResources().GetListeners()[i], hcm: &hcm}
		for _, hf := range hcm.GetHttpFilters() {
			f := httpFilter{name: hf.GetName()}
			tc := hf.GetTypedConfig()
			if tc == nil {
				return nil, fmt.Errorf("%s: http filter %q has no typed_config", where, hf.GetName())
			}
			switch {
			case tc.MessageIs(&extprocv3.ExternalProcessor{}):
				f.extProc = &extprocv3.ExternalProcessor{}
				if err := tc.UnmarshalTo(f.extProc); err != nil {
					return nil, fmt.Errorf("%s: http filter %q: %w", where, hf.GetName(), err)
				}
			case tc.MessageIs(&routerv3.Router{}):
				f.router = true
			}
			v.filters = append(v.filters, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// speaksHTTP2 reports whether Envoy talks HTTP/2 to the cluster's endpoints,
// either through the upstream HttpProtocolOptions extension or the older
// cluster field.
func speaksHTTP2(c *clusterv3.Cluster) bool {
	if c.GetHttp2ProtocolOptions() != nil { //nolint:staticcheck // deprecated but still honoured by Envoy
		return true
	}
	a, ok := c.GetTypedExtensionProtocolOptions()[httpOptionsKey]
	if !ok {
		return false
	}
	var opts httpv3.HttpProtocolOptions
	if err := a.UnmarshalTo(&opts); err != nil {
		return false
	}
	return opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

// envoyGrpcCluster returns the cluster an Envoy gRPC service points at, or "".
func envoyGrpcCluster(g *corev3.GrpcService) string {
	return g.GetEnvoyGrpc().GetClusterName()
}

// staticClusters indexes the bootstrap's static clusters by name.
func staticClusters(b *bootstrapv3.Bootstrap) map[string]*clusterv3.Cluster {
	m := make(map[string]*clusterv3.Cluster)
	for _, c := range b.GetStaticResources().GetClusters() {
		m[c.GetName()] = c
	}
	return m
}
