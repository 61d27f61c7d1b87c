package envoy

import (
	"fmt"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	bufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/buffer/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyhmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// Filter names as the bootstraps spell them.
const (
	hcmFilterName = "envoy.filters.network.http_connection_manager"
	// ExtProcFilterName is the ext_proc HTTP filter; Envoy keys the
	// attributes it sends to the processor under this name.
	ExtProcFilterName = "envoy.filters.http.ext_proc"
	// RouterFilterName is the terminal router HTTP filter.
	RouterFilterName = "envoy.filters.http.router"
	httpOptionsKey   = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// HTTPFilter is one entry of an HCM filter chain with its config unpacked.
type HTTPFilter struct {
	Name    string
	ExtProc *extprocv3.ExternalProcessor // set for the ext_proc filter
	Router  bool                         // the terminal router filter
	Buffer  bool                         // the buffer filter
}

// ListenerView is a listener with the parts kvroute cares about unpacked
// from their Any wrappers.
type ListenerView struct {
	Listener *listenerv3.Listener
	HCM      *hcmv3.HttpConnectionManager
	Filters  []HTTPFilter
}

// ExtProcConfig returns the config of the listener's routing ext_proc
// filter (the first one not in observability mode), or nil.
func (v ListenerView) ExtProcConfig() *extprocv3.ExternalProcessor {
	for _, f := range v.Filters {
		if f.ExtProc != nil && !f.ExtProc.GetObservabilityMode() {
			return f.ExtProc
		}
	}
	return nil
}

// EarlyRemovedHeaders lists the request headers the listener's HCM removes
// in its early header mutations, before routing and before any filter (so
// before ext_proc). Extensions other than header_mutation are an error.
func (v ListenerView) EarlyRemovedHeaders() ([]string, error) {
	var out []string
	for _, ext := range v.HCM.GetEarlyHeaderMutationExtensions() {
		var hm earlyhmv3.HeaderMutation
		if ext.GetTypedConfig() == nil || ext.GetTypedConfig().UnmarshalTo(&hm) != nil {
			return nil, fmt.Errorf("early header mutation %q: only %s is understood", ext.GetName(), "envoy.http.early_header_mutation.header_mutation")
		}
		for _, m := range hm.GetMutations() {
			if r := m.GetRemove(); r != "" {
				out = append(out, strings.ToLower(r))
			}
		}
	}
	return out, nil
}

// ListenerViews unpacks the HTTP connection manager and its HTTP filters of
// every static listener. A listener without an HCM is an error: every
// bootstrap kvroute ships is an HTTP proxy.
func ListenerViews(b *bootstrapv3.Bootstrap) ([]ListenerView, error) {
	var out []ListenerView
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
		v := ListenerView{Listener: b.GetStaticResources().GetListeners()[i], HCM: &hcm}
		for _, hf := range hcm.GetHttpFilters() {
			f := HTTPFilter{Name: hf.GetName()}
			tc := hf.GetTypedConfig()
			if tc == nil {
				return nil, fmt.Errorf("%s: http filter %q has no typed_config", where, hf.GetName())
			}
			switch {
			case tc.MessageIs(&extprocv3.ExternalProcessor{}):
				f.ExtProc = &extprocv3.ExternalProcessor{}
				if err := tc.UnmarshalTo(f.ExtProc); err != nil {
					return nil, fmt.Errorf("%s: http filter %q: %w", where, hf.GetName(), err)
				}
			case tc.MessageIs(&routerv3.Router{}):
				f.Router = true
			case tc.MessageIs(&bufferv3.Buffer{}):
				f.Buffer = true
			}
			v.Filters = append(v.Filters, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// SpeaksHTTP2 reports whether Envoy talks HTTP/2 to the cluster's endpoints,
// either through the upstream HttpProtocolOptions extension or the older
// cluster field.
func SpeaksHTTP2(c *clusterv3.Cluster) bool {
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
