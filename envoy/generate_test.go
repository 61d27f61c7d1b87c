package envoy

import (
	"bytes"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the shipped bootstraps from Generate")

// The YAMLs shipped in envoy/ are Generate's output for ExampleWorkers, so the
// files users copy and the ones `kvroute envoy-config` prints cannot drift.
func TestShippedBootstrapsAreGenerateOutput(t *testing.T) {
	for _, style := range Styles {
		t.Run(style, func(t *testing.T) {
			got, err := Generate(style, ExampleWorkers, Options{})
			if err != nil {
				t.Fatal(err)
			}
			path := style + ".yaml"
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from Generate(%q); run go test ./envoy -run TestShipped -update", path, style)
			}
			if _, err := Validate(want); err != nil {
				t.Fatalf("shipped %s fails validation: %v", path, err)
			}
		})
	}
}

func TestGenerateOutputValidatesForEveryStyle(t *testing.T) {
	workers := []Worker{
		{Cluster: "gpu-a", Address: "10.0.0.5:8000"},
		{Cluster: "gpu b", Address: "[fd00::7]:8000"},
		{Cluster: "gpu-c", Address: "vllm-2.vllm.svc:8000"},
	}
	opts := Options{ExtProcAddress: "kvroute.kvroute.svc:9002", XDSAddress: "10.1.1.1:18000",
		MessageTimeout: 1500 * time.Millisecond, ListenAddress: "[::]:10000"}
	for _, style := range Styles {
		t.Run(style, func(t *testing.T) {
			out, err := Generate(style, workers, opts)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Validate(out)
			if err != nil {
				t.Fatalf("generated %s bootstrap fails validation: %v\n%s", style, err, out)
			}
			clusters := staticClusters(b)
			if _, ok := clusters[ExtProcClusterName]; !ok {
				t.Fatalf("no %s cluster", ExtProcClusterName)
			}
			_, hasWorker := clusters["gpu b"]
			if hasWorker != (style == StyleClusterHeader) {
				t.Fatalf("style %s: worker cluster present = %v", style, hasWorker)
			}
			if style == StyleClusterHeader {
				if got := clusters["gpu-c"].GetType().String(); got != "STRICT_DNS" {
					t.Fatalf("host-name worker got cluster type %s", got)
				}
				// gpu-a is an IP literal, but its priority 1 (where a retry
				// goes) holds gpu-c's host name, which STATIC cannot resolve.
				if got := clusters["gpu-a"].GetType().String(); got != "STRICT_DNS" {
					t.Fatalf("IP worker beside a host-name worker got cluster type %s", got)
				}
				eps := clusters["gpu-a"].GetLoadAssignment().GetEndpoints()
				if len(eps) != 2 || eps[0].GetPriority() != 0 || len(eps[0].GetLbEndpoints()) != 1 || eps[1].GetPriority() != 1 || len(eps[1].GetLbEndpoints()) != 2 {
					t.Fatalf("gpu-a endpoints: want itself at priority 0 and the two others at priority 1, got %v", eps)
				}
				if n := len(clusters[FallbackClusterName].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()); n != 3 {
					t.Fatalf("fallback cluster has %d endpoints, want 3", n)
				}
			}
			views, _ := ListenerViews(b)
			if got := views[0].ExtProcConfig().GetMessageTimeout().AsDuration(); got != 1500*time.Millisecond {
				t.Fatalf("message_timeout %v", got)
			}
		})
	}
}

func TestGenerateRejectsBadInput(t *testing.T) {
	cases := []struct {
		name    string
		style   string
		workers []Worker
		opts    Options
		want    string
	}{
		{"unknown style", "nginx", ExampleWorkers, Options{}, "unknown style"},
		{"cluster-header without workers", StyleClusterHeader, nil, Options{}, "at least one worker"},
		{"duplicate cluster", StyleClusterHeader, []Worker{{"a", "1.2.3.4:1"}, {"a", "1.2.3.4:2"}}, Options{}, "used twice"},
		{"reserved cluster name", StyleClusterHeader, []Worker{{ExtProcClusterName, "1.2.3.4:1"}}, Options{}, "reserved"},
		{"worker without cluster", StyleClusterHeader, []Worker{{"", "1.2.3.4:1"}}, Options{}, "no cluster name"},
		{"worker without port", StyleClusterHeader, []Worker{{"a", "1.2.3.4"}}, Options{}, "missing port"},
		{"port zero", StyleClusterHeader, []Worker{{"a", "1.2.3.4:0"}}, Options{}, "port must be"},
		{"yaml injection in host", StyleClusterHeader, []Worker{{"a", "x}\n:1"}}, Options{}, "character"},
		{"bad ext_proc address", StyleOriginalDst, nil, Options{ExtProcAddress: "kvroute"}, "ext_proc address"},
		{"message timeout too long", StyleXDS, nil, Options{MessageTimeout: 2 * time.Hour}, "message timeout"},
		{"node id with spaces", StyleXDS, nil, Options{NodeID: "a b"}, "node id"},
		{"listen host name", StyleXDS, nil, Options{ListenAddress: "localhost:80"}, "IP literals"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Generate(tc.style, tc.workers, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// Worker cluster names are arbitrary strings; quoting keeps them intact.
func TestGenerateKeepsOddClusterNames(t *testing.T) {
	name := `w"0: {odd} # name`
	out, err := Generate(StyleClusterHeader, []Worker{{Cluster: name, Address: "127.0.0.1:9"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Validate(out)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := staticClusters(b)[name]
	if !ok || c.GetLoadAssignment().GetClusterName() != name {
		t.Fatalf("cluster %q lost in rendering", name)
	}
}

// BenchmarkGenerateClusterHeader shows why the cluster-header style is for
// small static fleets: every worker cluster holds every worker, so the
// bootstrap (and its validation) grows with workers².
func BenchmarkGenerateClusterHeader(b *testing.B) {
	for _, n := range []int{50, 200} {
		b.Run(strconv.Itoa(n)+"-workers", func(b *testing.B) {
			ws := make([]Worker, n)
			for i := range ws {
				ws[i] = Worker{Cluster: "w" + strconv.Itoa(i), Address: "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + ":8000"}
			}
			var size int
			for b.Loop() {
				out, err := Generate(StyleClusterHeader, ws, Options{})
				if err != nil {
					b.Fatal(err)
				}
				size = len(out)
			}
			b.ReportMetric(float64(size), "yaml-bytes")
			b.ReportMetric(float64(n*n), "endpoints")
		})
	}
}

// The response path: by default Envoy sends kvroute the response headers
// (and trailers, which keep the stream open to the response's end) only,
// so no body chunk waits on it; ResponsePathStreamed sends every body
// chunk too (STREAMED, or FULL_DUPLEX_STREAMED with trailers for
// original-dst); anything else is refused by name.
func TestGenerateResponsePath(t *testing.T) {
	for _, tc := range []struct {
		style, path string
		want        []string
	}{
		{StyleClusterHeader, "", []string{"response_header_mode: SEND", "response_body_mode: NONE", "response_trailer_mode: SEND"}},
		{StyleXDS, ResponsePathHeaders, []string{"response_header_mode: SEND", "response_body_mode: NONE"}},
		{StyleOriginalDst, "", []string{"response_header_mode: SEND", "response_body_mode: NONE", "response_trailer_mode: SEND", "request_body_mode: FULL_DUPLEX_STREAMED"}},
		{StyleClusterHeader, ResponsePathStreamed, []string{"response_body_mode: STREAMED", "response_trailer_mode: SKIP"}},
		{StyleXDS, ResponsePathStreamed, []string{"response_body_mode: STREAMED"}},
		{StyleOriginalDst, ResponsePathStreamed, []string{"response_body_mode: FULL_DUPLEX_STREAMED", "response_trailer_mode: SEND"}},
	} {
		out, err := Generate(tc.style, ExampleWorkers, Options{ResponsePath: tc.path})
		if err != nil {
			t.Fatalf("%s %q: %v", tc.style, tc.path, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s %q: no %q", tc.style, tc.path, w)
			}
		}
	}
	if _, err := Generate(StyleXDS, nil, Options{ResponsePath: "body"}); err == nil || !strings.Contains(err.Error(), `unknown response path "body"`) {
		t.Errorf("response path body: %v", err)
	}
}
