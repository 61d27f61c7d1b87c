package deploy

import (
	"fmt"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/kvroute/kvroute/envoy"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istionet "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// checkGatewayAPI checks what the Gateway implementation will follow: the
// pool's endpoint picker is kvroute's ext_proc port and fails open, the pool
// selects the vLLM pods on a port they listen on, and the HTTPRoute sends to
// that pool.
func checkGatewayAPI(t *testing.T, objs []Object) error {
	var pools []*inferencePool
	for _, o := range objs {
		if o.Kind == "InferencePool" {
			p, err := decodeInferencePool(o.JSON)
			if err != nil {
				return err
			}
			pools = append(pools, p)
		}
	}
	if len(pools) != 1 {
		return fmt.Errorf("want one InferencePool, have %d", len(pools))
	}
	p := pools[0]
	r := p.Spec.EndpointPickerRef
	if r == nil || r.Kind != "Service" || r.Port == nil || r.FailureMode != "FailOpen" {
		return fmt.Errorf("endpointPickerRef must name a Service with a port and failureMode FailOpen: %+v", r)
	}
	so, ok := find(objs, "Service", r.Name)
	if !ok {
		return fmt.Errorf("endpointPickerRef names missing Service %s", r.Name)
	}
	var svc corev1.Service
	if err := decodeStrict(so.JSON, &svc); err != nil {
		return err
	}
	grpcPort := false
	for _, sp := range svc.Spec.Ports {
		grpcPort = grpcPort || int(sp.Port) == r.Port.Number && sp.Port == 9002
	}
	if !grpcPort || svc.Spec.Selector["app.kubernetes.io/name"] != "kvroute" {
		return fmt.Errorf("endpoint picker %s:%d is not kvroute's ext_proc port 9002", r.Name, r.Port.Number)
	}
	d := selected(deployments(t, objs), p.Spec.Selector.MatchLabels)
	if d == nil || d.Name == "kvroute" {
		return fmt.Errorf("pool selector %v selects no model server Deployment", p.Spec.Selector.MatchLabels)
	}
	for _, tp := range p.Spec.TargetPorts {
		listens := false
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, cp := range c.Ports {
				listens = listens || int(cp.ContainerPort) == tp.Number
			}
		}
		if !listens {
			return fmt.Errorf("pool target port %d is not a port of %s", tp.Number, d.Name)
		}
	}
	routed := false
	for _, o := range objs {
		if o.Kind != "HTTPRoute" {
			continue
		}
		var hr gatewayv1.HTTPRoute
		if err := decodeStrict(o.JSON, &hr); err != nil {
			return err
		}
		for _, rule := range hr.Spec.Rules {
			for _, br := range rule.BackendRefs {
				g, k := "", "Service"
				if br.Group != nil {
					g = string(*br.Group)
				}
				if br.Kind != nil {
					k = string(*br.Kind)
				}
				if g == "inference.networking.k8s.io" && k == "InferencePool" && string(br.Name) == p.Metadata.Name {
					routed = true
				} else {
					return fmt.Errorf("HTTPRoute %s sends to %s/%s %s, not the InferencePool", hr.Name, g, k, br.Name)
				}
			}
		}
	}
	if !routed {
		return fmt.Errorf("no HTTPRoute sends to InferencePool %s", p.Metadata.Name)
	}
	return nil
}

func TestGatewayAPIPointsAtKvroute(t *testing.T) {
	objs := render(t, "overlays/gateway-api")
	if err := checkGatewayAPI(t, objs); err != nil {
		t.Fatal(err)
	}
	broken := map[string][]Object{
		"fail closed":          replaceIn(objs, "InferencePool", `"failureMode":"FailOpen"`, `"failureMode":"FailClose"`),
		"picker on metrics":    replaceIn(objs, "InferencePool", `"port":{"number":9002}`, `"port":{"number":9090}`),
		"picker not kvroute":   replaceIn(objs, "InferencePool", `"name":"kvroute"`, `"name":"vllm"`),
		"selects nothing":      replaceIn(objs, "InferencePool", `"app.kubernetes.io/name":"vllm"`, `"app.kubernetes.io/name":"sglang"`),
		"wrong target port":    replaceIn(objs, "InferencePool", `"number":8000`, `"number":8001`),
		"route to a Service":   replaceIn(objs, "HTTPRoute", `"kind":"InferencePool"`, `"kind":"Service"`),
		"route to other group": replaceIn(objs, "HTTPRoute", `"group":"inference.networking.k8s.io"`, `"group":"inference.networking.x-k8s.io"`),
	}
	for name, bad := range broken {
		if err := checkGatewayAPI(t, bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

func replaceIn(objs []Object, kind, old, new string) []Object {
	out := append([]Object(nil), objs...)
	for i, o := range out {
		if o.Kind == kind {
			out[i].JSON = []byte(strings.Replace(string(o.JSON), old, new, 1))
		}
	}
	return out
}

// checkEnvoyFilter holds the Istio overlay to envoy/original-dst.yaml: the
// ext_proc filter and the ORIGINAL_DST cluster must be the ones that
// bootstrap uses (which envoy.Validate checks), apart from the name of
// kvroute's cluster, which must be Istio's name for kvroute's Service port.
func checkEnvoyFilter(objs []Object) error {
	o, ok := find(objs, "EnvoyFilter", "kvroute-ext-proc")
	if !ok {
		return fmt.Errorf("no EnvoyFilter kvroute-ext-proc")
	}
	m, err := decodeIstio(o.JSON, func() proto.Message { return new(istionet.EnvoyFilter) })
	if err != nil {
		return err
	}
	ef := m.(*istionet.EnvoyFilter)
	ref, err := originalDst()
	if err != nil {
		return err
	}
	var sawCluster, sawRoute bool
	sawFilters := map[string]bool{}
	for i, p := range ef.GetConfigPatches() {
		if p.GetMatch().GetContext() != istionet.EnvoyFilter_GATEWAY {
			return fmt.Errorf("patch %d does not apply to the gateway", i)
		}
		js, err := protojson.Marshal(p.GetPatch().GetValue())
		if err != nil {
			return err
		}
		switch p.GetApplyTo() {
		case istionet.EnvoyFilter_HTTP_FILTER:
			if p.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_INSERT_BEFORE ||
				p.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != "envoy.filters.http.router" {
				return fmt.Errorf("ext_proc must be inserted before envoy.filters.http.router")
			}
			var f hcmv3.HttpFilter
			if err := protojson.Unmarshal(js, &f); err != nil {
				return fmt.Errorf("ext_proc filter: %w", err)
			}
			var ep extprocv3.ExternalProcessor
			if err := f.GetTypedConfig().UnmarshalTo(&ep); err != nil {
				return fmt.Errorf("ext_proc filter config: %w", err)
			}
			if err := ep.ValidateAll(); err != nil {
				return fmt.Errorf("ext_proc filter config: %w", err)
			}
			want := "outbound|9002||kvroute.kvroute.svc.cluster.local"
			if got := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != want {
				return fmt.Errorf("ext_proc cluster %q, want Istio's %q", got, want)
			}
			ep.GetGrpcService().GetEnvoyGrpc().ClusterName = envoy.ExtProcClusterName
			if want := ref.extProcs[f.GetName()]; want == nil || !proto.Equal(&ep, want) {
				return fmt.Errorf("ext_proc filter %q differs from envoy/original-dst.yaml's:\n%v\nwant\n%v", f.GetName(), &ep, want)
			}
			sawFilters[f.GetName()] = true
		case istionet.EnvoyFilter_CLUSTER:
			var c clusterv3.Cluster
			if err := protojson.Unmarshal(js, &c); err != nil {
				return fmt.Errorf("cluster: %w", err)
			}
			if !proto.Equal(&c, ref.cluster) {
				return fmt.Errorf("cluster differs from envoy/original-dst.yaml's:\n%v\nwant\n%v", &c, ref.cluster)
			}
			sawCluster = true
		case istionet.EnvoyFilter_HTTP_ROUTE:
			var r routev3.Route
			if err := protojson.Unmarshal(js, &r); err != nil {
				return fmt.Errorf("route: %w", err)
			}
			if r.GetRoute().GetCluster() != envoy.OriginalDstClusterName || r.GetRoute().GetTimeout().AsDuration() != 0 {
				return fmt.Errorf("route must go to %s with no timeout: %v", envoy.OriginalDstClusterName, &r)
			}
			if len(r.GetRequestHeadersToRemove()) != 1 || r.GetRequestHeadersToRemove()[0] != envoy.TargetHeader {
				return fmt.Errorf("route must strip %s", envoy.TargetHeader)
			}
			sawRoute = true
		}
	}
	sawFilter := len(sawFilters) == len(ref.extProcs)
	if !sawFilter || !sawCluster || !sawRoute {
		return fmt.Errorf("EnvoyFilter needs every ext_proc filter of envoy/original-dst.yaml (%d of %d), the ORIGINAL_DST cluster and the route patch (have %v %v)", len(sawFilters), len(ref.extProcs), sawCluster, sawRoute)
	}
	// The route patch finds the VirtualService route by name.
	vs, ok := find(objs, "VirtualService", "llm")
	if !ok || !strings.Contains(string(vs.JSON), `"name":"kvroute"`) {
		return fmt.Errorf("no VirtualService route named kvroute for the route patch")
	}
	return nil
}

type originalDstRef struct {
	// extProcs are the ext_proc filters by name: the routing one and the
	// observing one.
	extProcs map[string]*extprocv3.ExternalProcessor
	cluster  *clusterv3.Cluster
}

func originalDst() (*originalDstRef, error) {
	y, err := envoy.Generate(envoy.StyleOriginalDst, nil, envoy.Options{})
	if err != nil {
		return nil, err
	}
	b, err := envoy.ParseBootstrap(y)
	if err != nil {
		return nil, err
	}
	ref := &originalDstRef{extProcs: map[string]*extprocv3.ExternalProcessor{}}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == envoy.OriginalDstClusterName {
			ref.cluster = c
		}
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		return nil, err
	}
	for _, f := range hcm.GetHttpFilters() {
		ep := new(extprocv3.ExternalProcessor)
		if f.GetTypedConfig().MessageIs(ep) {
			if err := f.GetTypedConfig().UnmarshalTo(ep); err != nil {
				return nil, err
			}
			ref.extProcs[f.GetName()] = ep
		}
	}
	if ref.extProcs["envoy.filters.http.ext_proc"] == nil || ref.cluster == nil {
		return nil, fmt.Errorf("original-dst bootstrap lacks ext_proc or %s", envoy.OriginalDstClusterName)
	}
	return ref, nil
}

func TestIstioEnvoyFilterMatchesOriginalDst(t *testing.T) {
	objs := render(t, "overlays/istio")
	if err := checkEnvoyFilter(objs); err != nil {
		t.Fatal(err)
	}
	broken := map[string][]Object{
		"buffered body":         replaceIn(objs, "EnvoyFilter", `"request_body_mode":"FULL_DUPLEX_STREAMED"`, `"request_body_mode":"BUFFERED"`),
		"trailers skipped":      replaceIn(objs, "EnvoyFilter", `"request_trailer_mode":"SEND"`, `"request_trailer_mode":"SKIP"`),
		"after the router":      replaceIn(objs, "EnvoyFilter", `"INSERT_BEFORE"`, `"INSERT_AFTER"`),
		"wrong kvroute cluster": replaceIn(objs, "EnvoyFilter", `outbound|9002||kvroute.kvroute`, `outbound|9090||kvroute.kvroute`),
		"misspelled ext_proc":   replaceIn(objs, "EnvoyFilter", `"message_timeout"`, `"message_timeot"`),
		"other destination hdr": replaceIn(objs, "EnvoyFilter", `"http_header_name":"x-gateway-destination-endpoint"`, `"http_header_name":"x-target-worker"`),
		"route keeps a timeout": replaceIn(objs, "EnvoyFilter", `"timeout":"0s"`, `"timeout":"15s"`),
		"route renamed":         replaceIn(objs, "VirtualService", `"name":"kvroute"`, `"name":"llm"`),
		"sidecar context":       replaceIn(objs, "EnvoyFilter", `"context":"GATEWAY"`, `"context":"SIDECAR_INBOUND"`),
		"observer renamed":      replaceIn(objs, "EnvoyFilter", `"name":"kvroute.observe"`, `"name":"kvroute.watch"`),
		"response on the route": replaceIn(objs, "EnvoyFilter", `"response_header_mode":"SKIP"`, `"response_header_mode":"SEND"`),
	}
	for name, bad := range broken {
		if err := checkEnvoyFilter(bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

func TestServiceMonitorScrapesKvrouteMetrics(t *testing.T) {
	objs := render(t, withMonitoring)
	check := func(objs []Object) error {
		o, ok := find(objs, "ServiceMonitor", "kvroute")
		if !ok {
			return fmt.Errorf("no ServiceMonitor")
		}
		var sm monitoringv1.ServiceMonitor
		if err := decodeStrict(o.JSON, &sm); err != nil {
			return err
		}
		so, ok := find(objs, "Service", "kvroute")
		if !ok {
			return fmt.Errorf("no kvroute Service")
		}
		var svc corev1.Service
		if err := decodeStrict(so.JSON, &svc); err != nil {
			return err
		}
		for k, v := range sm.Spec.Selector.MatchLabels {
			if svc.Labels[k] != v {
				return fmt.Errorf("selector %v does not match the kvroute Service's labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
			}
		}
		for _, ep := range sm.Spec.Endpoints {
			for _, sp := range svc.Spec.Ports {
				if sp.Name == ep.Port && sp.Port == 9090 && ep.Path == "/metrics" {
					return nil
				}
			}
		}
		return fmt.Errorf("no endpoint scrapes /metrics on the kvroute Service's 9090 port")
	}
	if err := check(objs); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]Object{
		"wrong port name": replaceIn(objs, "ServiceMonitor", `"port":"metrics"`, `"port":"grpc"`),
		"wrong selector":  replaceIn(objs, "ServiceMonitor", `"matchLabels":{"app.kubernetes.io/name":"kvroute"}`, `"matchLabels":{"app.kubernetes.io/name":"kv"}`),
	} {
		if err := check(bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}
