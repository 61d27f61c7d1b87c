package envoy

import (
	"os"
	"strings"
	"testing"
)

// readShipped reads a shipped bootstrap; "style/path" generates the style
// for ExampleWorkers with that response path instead.
func readShipped(t testing.TB, style string) string {
	t.Helper()
	if st, path, ok := strings.Cut(style, "/"); ok {
		b, err := Generate(st, ExampleWorkers, Options{ResponsePath: path})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	b, err := os.ReadFile(style + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// breakVariant replaces old with new in a shipped bootstrap, failing the test
// if old is not there (so a broken variant can never silently equal the original).
func breakVariant(t *testing.T, src, old, new string) string {
	t.Helper()
	if !strings.Contains(src, old) {
		t.Fatalf("variant anchor %q not found", old)
	}
	return strings.Replace(src, old, new, 1)
}

// Every check Validate makes is shown able to fail: each case breaks one
// property of a shipped bootstrap and expects the error to name it.
func TestValidateRejectsBrokenVariants(t *testing.T) {
	cases := []struct {
		name, style, old, new, want string
	}{
		{"yaml syntax", StyleClusterHeader, "static_resources:", "static_resources: [", "not YAML"},
		{"unknown field", StyleClusterHeader, "stat_prefix: llm", "stat_prefix: llm\n          no_such_field: 1", "unknown field"},
		{"unregistered type", StyleClusterHeader, "extensions.filters.http.router.v3.Router", "extensions.filters.http.nope.v3.Nope", "nope"},
		{"bootstrap rule", StyleClusterHeader, "connect_timeout: 5s", "connect_timeout: -5s", "ConnectTimeout"},
		{"rule inside Any", StyleClusterHeader, "message_timeout: 60s", "message_timeout: 7200s", "MessageTimeout"},
		{"rule inside nested Any", StyleClusterHeader, "http2_protocol_options: {}", "http2_protocol_options: {max_concurrent_streams: 0}", "MaxConcurrentStreams"},
		{"full duplex request needs trailers", StyleOriginalDst, "request_trailer_mode: SEND", "request_trailer_mode: SKIP", "request_trailer_mode SEND"},
		{"full duplex response needs trailers", StyleOriginalDst, "response_body_mode: NONE\n                response_trailer_mode: SEND", "response_body_mode: FULL_DUPLEX_STREAMED\n                response_trailer_mode: DEFAULT", "response_trailer_mode SEND"},
		{"full duplex cannot fail open", StyleOriginalDst, "failure_mode_allow: false", "failure_mode_allow: true", "failure_mode_allow must stay false"},
		{"ext_proc with two services", StyleClusterHeader, "message_timeout: 60s", "http_service: {http_service: {http_uri: {uri: \"http://x\", cluster: kvroute, timeout: 1s}}}\n              message_timeout: 60s", "exactly one of grpc_service"},
		{"route cache settings conflict", StyleClusterHeader, "failure_mode_allow: true", "failure_mode_allow: true\n              disable_clear_route_cache: true\n              route_cache_action: RETAIN", "cannot both be set"},
		{"original dst needs cluster provided", StyleOriginalDst, "lb_policy: CLUSTER_PROVIDED", "lb_policy: ROUND_ROBIN", "CLUSTER_PROVIDED"},
		{"cluster provided needs original dst", StyleClusterHeader, "lb_policy: LEAST_REQUEST", "lb_policy: CLUSTER_PROVIDED", "needs a cluster type"},
		{"original dst without header", StyleOriginalDst, "use_http_header: true", "use_http_header: false", "use_http_header"},
		{"original dst header name", StyleOriginalDst, "http_header_name: x-gateway-destination-endpoint", "http_header_name: x-destination", "kvroute writes"},
		{"original dst load assignment", StyleOriginalDst, "original_dst_lb_config:", "load_assignment: {cluster_name: original_destination_cluster}\n    original_dst_lb_config:", "no load_assignment"},
		{"route cluster missing", StyleClusterHeader, "cluster: kvroute_fallback\n", "cluster: kvroute_fallbak\n", "\"kvroute_fallbak\" does not exist"},
		{"ext_proc cluster missing", StyleClusterHeader, "envoy_grpc: {cluster_name: kvroute}", "envoy_grpc: {cluster_name: kvroute2}", "\"kvroute2\" does not exist"},
		{"ads cluster missing", StyleXDS, "envoy_grpc: {cluster_name: kvroute_xds}", "envoy_grpc: {cluster_name: xds}", "ADS: cluster \"xds\" does not exist"},
		{"ads without cds", StyleXDS, "  cds_config:\n    ads: {}\n", "  cds_config:\n    path_config_source: {path: /tmp/cds.yaml}\n", "ads: {}"},
		{"ext_proc over http/1", StyleClusterHeader, "explicit_http_config:\n          http2_protocol_options: {}", "explicit_http_config:\n          http_protocol_options: {}", "must speak HTTP/2"},
		{"ads over http/1", StyleXDS, "    load_assignment:\n      cluster_name: kvroute_xds", "    typed_extension_protocol_options: {}\n    load_assignment:\n      cluster_name: kvroute_xds", "must speak HTTP/2"},
		{"cluster header name", StyleClusterHeader + "/" + ResponsePathHeaders, "cluster_header: x-target-worker", "cluster_header: x-worker", "cluster_header is \"x-worker\""},
		{"target header reaches worker", StyleClusterHeader + "/" + ResponsePathHeaders, "request_headers_to_remove: [x-target-worker]", "request_headers_to_remove: [x-other]", "request_headers_to_remove"},
		{"no message timeout", StyleClusterHeader, "message_timeout: 60s", "", "message_timeout must be set"},
		{"no grpc health check", StyleClusterHeader, "grpc_health_check: {}", "http_health_check: {path: /healthz}", "gRPC health check"},
		{"default circuit breakers", StyleOriginalDst, "max_requests: 100000", "max_requests: 1024", "circuit breakers"},
		{"worker route without retries", StyleClusterHeader, "retry_on: connect-failure,reset", "retry_on: reset", "retry_on connect-failure"},
		{"worker route with no retry", StyleXDS, "num_retries: 1", "num_retries: 0", "num_retries >= 1"},
		{"xds validates clusters at load", StyleXDS, "validate_clusters: false\n", "validate_clusters: true\n", "validate_clusters: false"},
		{"xds validate_clusters unset", StyleXDS, "            validate_clusters: false\n", "", "validate_clusters: false"},
		{"xds routes by cluster_header", StyleXDS, "cluster: kvroute_workers\n", "cluster_header: x-target-worker\n", "no per-worker clusters"},
		{"xds routes to an unserved cluster", StyleXDS, "cluster: kvroute_workers\n", "cluster: w0\n", "kvroute serves only \"kvroute_workers\""},
		{"static bootstrap routes to the served cluster", StyleClusterHeader, "cluster: kvroute_fallback\n", "cluster: kvroute_workers\n", "\"kvroute_workers\" does not exist among the static clusters"},
		{"unknown retry condition", StyleClusterHeader, "retry_on: connect-failure,reset", "retry_on: connect-failure,on-a-whim", "\"on-a-whim\" is not a condition"},
		{"override_host reads another header", StyleClusterHeader, "- metadata: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint}]}", "- header: x-other", "read kvroute's endpoint list"},
		{"override_host source with both", StyleClusterHeader, "- metadata: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint}]}", "- metadata: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint}]}\n              header: x-gateway-destination-endpoint", "exactly one of header and metadata"},
		{"unregistered retry predicate", StyleClusterHeader, "retry.host.previous_hosts.v3.PreviousHostsPredicate", "retry.host.nope.v3.Nope", "nope"},
		{"route timeout default", StyleClusterHeader + "/" + ResponsePathHeaders, "cluster_header: x-target-worker\n                  timeout: 0s", "cluster_header: x-target-worker", "timeout must be set"},
		{"route timeout short", StyleOriginalDst, "original_destination_cluster\n                  timeout: 0s", "original_destination_cluster\n                  timeout: 30s", "timeout must be set"},
		{"skipped request headers without a buffer", StyleClusterHeader, bufferFilter, "", "buffer filter"},
		{"xds skipped request headers without a buffer", StyleXDS, bufferFilter, "", "buffer filter"},
		{"observing filter fails closed", StyleClusterHeader, "observability_mode: true\n              failure_mode_allow: true", "observability_mode: true\n              failure_mode_allow: false", "observing ext_proc filter"},
		{"metadata route reads another key", StyleClusterHeader, "path: [{key: x-target-worker}]", "path: [{key: x-other}]", "routes on envoy.lb"},
		{"stream idle timeout short", StyleXDS, "stream_idle_timeout: 3600s", "stream_idle_timeout: 60s", "stream_idle_timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := breakVariant(t, readShipped(t, tc.style), tc.old, tc.new)
			_, err := Validate([]byte(src))
			if err == nil {
				t.Fatalf("broken variant accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not mention %q:\n%v", tc.want, err)
			}
		})
	}
}

// bufferFilter is the buffer filter as the bootstraps that skip the
// request headers hold it.
const bufferFilter = `          - name: envoy.filters.http.buffer
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
              max_request_bytes: 33554432
`

func TestValidateRequiresExtProcAndRouter(t *testing.T) {
	src := readShipped(t, StyleClusterHeader)
	start := strings.Index(src, "          - name: envoy.filters.http.ext_proc")
	end := strings.Index(src, "          - name: envoy.filters.http.router")
	_, err := Validate([]byte(src[:start] + src[end:]))
	if err == nil || !strings.Contains(err.Error(), "has no envoy.filters.http.ext_proc filter") {
		t.Fatalf("config without ext_proc: %v", err)
	}
	end2 := strings.Index(src, "  clusters:")
	_, err = Validate([]byte(src[:end] + src[end2:]))
	if err == nil || !strings.Contains(err.Error(), "last http filter must be envoy.filters.http.router") {
		t.Fatalf("config without router: %v", err)
	}
}

// Bootstrap.ValidateAll alone misses rules inside Any; Validate must not.
func TestValidateLooksInsideAny(t *testing.T) {
	src := breakVariant(t, readShipped(t, StyleClusterHeader), "message_timeout: 60s", "message_timeout: 7200s")
	b, err := ParseBootstrap([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("precondition: Bootstrap.ValidateAll already sees the Any content: %v", err)
	}
	if err := ValidateBootstrap(b); err == nil {
		t.Fatal("ValidateBootstrap accepted an out-of-range message_timeout inside Any")
	}
}

func TestValidateReportsAllFailuresTogether(t *testing.T) {
	src := readShipped(t, StyleOriginalDst)
	src = breakVariant(t, src, "request_trailer_mode: SEND", "request_trailer_mode: SKIP")
	src = breakVariant(t, src, "lb_policy: CLUSTER_PROVIDED", "lb_policy: RANDOM")
	_, err := Validate([]byte(src))
	if err == nil || !strings.Contains(err.Error(), "2 check(s)") {
		t.Fatalf("want both failures reported, got %v", err)
	}
}

func FuzzValidate(f *testing.F) {
	for _, s := range Styles {
		f.Add(readShipped(f, s))
	}
	f.Add("{}")
	f.Add("static_resources: {listeners: [{name: x}]}")
	f.Add("static_resources: {clusters: [{name: a, type: ORIGINAL_DST}]}")
	f.Fuzz(func(t *testing.T, src string) {
		b, err := Validate([]byte(src))
		if err != nil {
			return
		}
		if b == nil {
			t.Fatal("nil bootstrap without error")
		}
	})
}

// Every shipped style drops client copies of the routing headers before
// ext_proc; a bootstrap that forgets one is refused.
func TestValidateRequiresEarlyStripOfRoutingHeaders(t *testing.T) {
	for _, style := range Styles {
		src := readShipped(t, style)
		for _, h := range []string{TargetHeader, DestinationHeader} {
			broken := breakVariant(t, src, "              - remove: "+h+"\n", "")
			_, err := Validate([]byte(broken))
			if err == nil || !strings.Contains(err.Error(), h+" must be removed by an early header mutation") {
				t.Errorf("%s without the early removal of %s: %v", style, h, err)
			}
		}
	}
}
