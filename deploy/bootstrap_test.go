package deploy

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/kvroute/kvroute/envoy"
)

var update = flag.Bool("update", false, "rewrite the generated Envoy bootstraps under deploy/")

// shippedBootstraps are the Envoy bootstraps deploy/ ships: each is exactly
// what `kvroute envoy-config` prints for its settings, so they cannot drift
// from the checked templates in envoy/.
var shippedBootstraps = []struct {
	path    string
	style   string
	workers []envoy.Worker
	opts    envoy.Options
}{
	// Kubernetes: workers are found at run time and served to Envoy over ADS
	// by kvroute; Envoy reaches every kvroute replica through the headless
	// Service.
	{"k8s/base/envoy-bootstrap.yaml", envoy.StyleXDS, nil, envoy.Options{ExtProcAddress: "kvroute-grpc:9002", XDSAddress: "kvroute-grpc:18000"}},
	// docker compose: one vLLM engine on the compose network, registered by
	// kvbridge as worker vllm-0 at vllm:8000.
	{"compose/envoy.yaml", envoy.StyleClusterHeader, []envoy.Worker{{Cluster: "vllm-0", Address: "vllm:8000"}},
		envoy.Options{ExtProcAddress: "kvroute:9002"}},
}

func TestShippedBootstrapsAreGeneratedAndValid(t *testing.T) {
	for _, b := range shippedBootstraps {
		want, err := envoy.Generate(b.style, b.workers, b.opts)
		if err != nil {
			t.Fatalf("%s: %v", b.path, err)
		}
		if *update {
			if err := os.WriteFile(b.path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(b.path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := envoy.Validate(got); err != nil {
			t.Errorf("%s fails envoy.Validate: %v", b.path, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from envoy.Generate's output; run `go test -run ShippedBootstraps -update` in deploy/", b.path)
		}
	}
}
