package envoytest

import (
	"context"
	"github.com/kvroute/kvroute/envoy"
	"net/http"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Where a bootstrap and the Gateway disagree, loading fails instead of the
// Gateway behaving unlike Envoy.
func TestLoadGatewayRejectsWhatItDoesNotImplement(t *testing.T) {
	eps := map[string][]string{envoy.ExtProcClusterName: {"127.0.0.1:9"}}
	cases := []struct {
		name, style, old, new, want string
	}{
		{"streamed request body", envoy.StyleClusterHeader, "request_body_mode: BUFFERED", "request_body_mode: STREAMED", "request_body_mode STREAMED"},
		{"buffered response body", envoy.StyleClusterHeader, "response_body_mode: STREAMED", "response_body_mode: BUFFERED", "response_body_mode BUFFERED"},
		{"request header skip", envoy.StyleClusterHeader, "request_header_mode: SEND", "request_header_mode: SKIP", "request_header_mode SKIP"},
		{"buffered body sent early", envoy.StyleClusterHeader, "failure_mode_allow: true", "failure_mode_allow: true\n              send_body_without_waiting_for_header_response: true", "send_body_without_waiting"},
		{"retry on 5xx", envoy.StyleClusterHeader, "retry_on: connect-failure,reset", "retry_on: connect-failure,5xx", `retry_on "5xx"`},
		{"per-try timeout", envoy.StyleClusterHeader, "num_retries: 1", "num_retries: 1\n                    per_try_timeout: 1s", "per_try_timeout"},
		{"override_host fallback", envoy.StyleClusterHeader, "round_robin.v3.RoundRobin", "round_robin.v3.RoundRobin\n                    slow_start_config: {}", "slow_start_config"},
		{"regex header match", envoy.StyleClusterHeader, "present_match: true", "safe_regex_match: {regex: \".+\"}", "safe_regex_match"},
		{"unknown attribute", envoy.StyleClusterHeader, "failure_mode_allow: true", "failure_mode_allow: true\n              request_attributes: [xds.route_name]", "xds.route_name"},
		{"observability mode", envoy.StyleOriginalDst, "failure_mode_allow: false", "failure_mode_allow: false\n              observability_mode: true", "observability_mode"},
		{"cluster field", envoy.StyleOriginalDst, "lb_policy: CLUSTER_PROVIDED", "lb_policy: CLUSTER_PROVIDED\n    upstream_connection_options: {tcp_keepalive: {}}", "upstream_connection_options"},
		{"metadata forwarding", envoy.StyleOriginalDst, "untyped: [envoy.lb.subset_hint]", "untyped: [envoy.lb.subset_hint, custom]", "\"custom\" is not supported"},
		{"typed metadata forwarding", envoy.StyleOriginalDst, "forwarding_namespaces: {untyped:", "forwarding_namespaces: {typed: [x], untyped:", "typed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := breakVariant(t, readShipped(t, tc.style), tc.old, tc.new)
			_, err := LoadGateway([]byte(src), GatewayOptions{Endpoints: eps})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %q", err, tc.want)
			}
		})
	}
	t.Run("endpoints for an unknown cluster", func(t *testing.T) {
		_, err := LoadGateway([]byte(readShipped(t, envoy.StyleClusterHeader)), GatewayOptions{Endpoints: map[string][]string{"w9": {"127.0.0.1:1"}}})
		if err == nil || !strings.Contains(err.Error(), "w9") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("endpoints for the ORIGINAL_DST cluster", func(t *testing.T) {
		_, err := LoadGateway([]byte(readShipped(t, envoy.StyleOriginalDst)), GatewayOptions{Endpoints: map[string][]string{envoy.OriginalDstClusterName: {"127.0.0.1:1"}}})
		if err == nil || !strings.Contains(err.Error(), "ORIGINAL_DST") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("invalid bootstrap", func(t *testing.T) {
		src := breakVariant(t, readShipped(t, envoy.StyleOriginalDst), "request_trailer_mode: SEND", "request_trailer_mode: SKIP")
		if _, err := LoadGateway([]byte(src), GatewayOptions{}); err == nil {
			t.Fatal("a bootstrap Envoy would refuse was loaded")
		}
	})
}

func TestRequestAttributesKeyedUnderFilterName(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, router{decide: pickFromBody, clear: true}.script)
	g := startGateway(t, envoy.StyleClusterHeader, edits("failure_mode_allow: true",
		"failure_mode_allow: true\n              request_attributes: [request.path, request.method, source.port]"), f.endpoints(proc.addr))
	post(t, g.URL(), `{"user":"w0"}`)
	attrs := proc.lastSession(t).received[0].GetAttributes()[envoy.ExtProcFilterName].GetFields()
	if attrs["request.path"].GetStringValue() != "/v1/chat/completions" || attrs["request.method"].GetStringValue() != "POST" ||
		attrs["source.port"].GetNumberValue() == 0 {
		t.Fatalf("attributes %v", attrs)
	}
}

func TestStartGatewayForEveryStyle(t *testing.T) {
	for _, style := range envoy.Styles {
		t.Run(style, func(t *testing.T) {
			f := startFleet(t)
			var workers []envoy.Worker
			for _, w := range envoy.ExampleWorkers {
				workers = append(workers, envoy.Worker{Cluster: w.Cluster, Address: hostOf(f.workers[w.Cluster])})
			}
			// As kvroute answers: the headers, and the endpoint list in
			// envoy.lb metadata, which the xds style's shared cluster routes on.
			r := listRouter("w2", workers[2].Address)
			r.decide = func(_ *corev3.HeaderMap, _ []byte) *extprocsvc.HeaderMutation {
				return setHeaders(envoy.TargetHeader, "w2", envoy.DestinationHeader, workers[2].Address)
			}
			proc := startProcServer(t, r.script)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g, err := StartGateway(ctx, style, workers, proc.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			resp, got := post(t, g.URL(), `{}`)
			if resp.StatusCode != 200 || got.Worker != "w2" {
				t.Fatalf("status %d worker %q", resp.StatusCode, got.Worker)
			}
		})
	}
}

func TestSubsetHintForwardedInMetadataContext(t *testing.T) {
	worker := startWorker(t, "w-dst")
	proc := startProcServer(t, router{decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
		return setHeaders(envoy.DestinationHeader, hostOf(worker))
	}}.script)
	g, err := LoadGateway([]byte(readShipped(t, envoy.StyleOriginalDst)), GatewayOptions{
		ListenAddress: "127.0.0.1:0",
		Endpoints:     map[string][]string{envoy.ExtProcClusterName: {proc.addr}},
		SubsetHint: func(r *http.Request) []string {
			if r.Header.Get("X-No-Hint") != "" {
				return nil
			}
			return []string{hostOf(worker), "10.9.9.9:8000"}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	post(t, g.URL(), `{}`)
	md := proc.lastSession(t).received[0].GetMetadataContext().GetFilterMetadata()[subsetHintNamespace]
	list := md.GetFields()[subsetHintKey].GetListValue().GetValues()
	if len(list) != 2 || list[0].GetStringValue() != hostOf(worker) || list[1].GetStringValue() != "10.9.9.9:8000" {
		t.Fatalf("metadata_context %v", md)
	}
	post(t, g.URL(), `{}`, "X-No-Hint", "1")
	if mc := proc.lastSession(t).received[0].GetMetadataContext(); mc != nil {
		t.Fatalf("metadata_context sent without a hint: %v", mc)
	}
}
