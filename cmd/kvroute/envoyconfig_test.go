package main

import (
	"bytes"
	"context"
	"errors"
	"github.com/kvroute/kvroute/internal/cli"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/envoy"
)

const yamlWorkers = `
- {id: w0, model: m, address: "10.0.0.1:8000", block_size: 16, kv_total_blocks: 1000}
- {id: w1, model: m, address: "10.0.0.2:8000", cluster: gpu-b, block_size: 16, kv_total_blocks: 1000}
- {id: w1-dp1, model: m, address: "10.0.0.2:8000", cluster: gpu-b, block_size: 16, kv_total_blocks: 1000, dp_rank: 1}
`

const jsonWorkers = `{"workers": [{"id": "w0", "model": "m", "address": "vllm-0.vllm:8000", "block_size": 16, "kv_total_blocks": 1000}]}`

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func clusterNames(t *testing.T, out []byte) []string {
	t.Helper()
	b, err := envoy.Validate(out)
	if err != nil {
		t.Fatalf("output fails envoy.Validate: %v\n%s", err, out)
	}
	var n []string
	for _, c := range b.GetStaticResources().GetClusters() {
		n = append(n, c.GetName())
	}
	slices.Sort(n)
	return n
}

func TestEnvoyConfigPrintsValidBootstraps(t *testing.T) {
	yw := writeFile(t, "workers.yaml", yamlWorkers)
	jw := writeFile(t, "workers.json", jsonWorkers)
	cases := []struct {
		name     string
		args     []string
		clusters []string
		contains []string
	}{
		{"cluster-header from YAML: one cluster per cluster name", []string{"--style", "cluster-header", "--workers-file", yw},
			[]string{"gpu-b", "kvroute", "kvroute_fallback", "w0"}, []string{"value: {string_match: {exact: \"gpu-b\"}}", "cluster: \"gpu-b\"", `"10.0.0.2", port_value: 8000`, "request_header_mode: SKIP", "observability_mode: true"}},
		{"cluster-header from JSON with a DNS worker and in-cluster kvroute", []string{"--style", "cluster-header", "--workers-file", jw, "--ext-proc-addr", "kvroute.kvroute.svc:9002", "--listen", "0.0.0.0:10000"},
			[]string{"kvroute", "kvroute_fallback", "w0"}, []string{"type: STRICT_DNS", `"kvroute.kvroute.svc", port_value: 9002`, "port_value: 10000"}},
		{"original-dst needs no workers", []string{"--style", "original-dst"},
			[]string{"kvroute", "original_destination_cluster"}, []string{"FULL_DUPLEX_STREAMED", "x-gateway-destination-endpoint"}},
		{"xds points at kvroute's ADS", []string{"--style", "xds", "--xds-addr", "10.1.2.3:18000", "--node-id", "edge-1"},
			[]string{"kvroute", "kvroute_xds"}, []string{"id: edge-1", `"10.1.2.3", port_value: 18000`, "response_body_mode: NONE"}},
		{"both headers on the routing stream on request", []string{"--style", "xds", "--response-path", "headers"},
			[]string{"kvroute", "kvroute_xds"}, []string{"request_header_mode: SEND", "response_header_mode: SEND"}},
		{"the response body through kvroute on request", []string{"--style", "original-dst", "--response-path", "streamed"},
			[]string{"kvroute", "original_destination_cluster"}, []string{"response_body_mode: FULL_DUPLEX_STREAMED"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if err := runEnvoyConfig(context.Background(), c.args, &out, &errb); err != nil {
				t.Fatalf("runEnvoyConfig: %v\nstderr: %s", err, errb.String())
			}
			if got := clusterNames(t, out.Bytes()); !slices.Equal(got, c.clusters) {
				t.Errorf("clusters %v, want %v", got, c.clusters)
			}
			for _, s := range c.contains {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output lacks %q", s)
				}
			}
		})
	}
}

func TestEnvoyConfigRefusesBadInput(t *testing.T) {
	conflict := writeFile(t, "conflict.yaml", `
- {id: a, model: m, address: "10.0.0.1:8000", cluster: c, block_size: 16, kv_total_blocks: 1}
- {id: b, model: m, address: "10.0.0.2:8000", cluster: c, block_size: 16, kv_total_blocks: 1}
`)
	reserved := writeFile(t, "reserved.yaml", `[{id: kvroute, model: m, address: "10.0.0.1:8000", block_size: 16, kv_total_blocks: 1}]`)
	broken := writeFile(t, "broken.yaml", `[{id: w0, model: m, adress: "10.0.0.1:8000"}]`) //nolint:misspell // an unknown field on purpose
	empty := writeFile(t, "empty.yaml", ``)
	cases := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no style", nil, true, "--style is required"},
		{"unknown style", []string{"--style", "round-robin"}, false, "unknown style"},
		{"cluster-header without workers file", []string{"--style", "cluster-header"}, true, "needs --workers-file"},
		{"cluster-header with an empty workers file", []string{"--style", "cluster-header", "--workers-file", empty}, true, "needs --workers-file"},
		{"missing workers file", []string{"--style", "cluster-header", "--workers-file", "/nonexistent/w.yaml"}, false, "no such file"},
		{"unknown record field", []string{"--style", "cluster-header", "--workers-file", broken}, false, "adress"}, //nolint:misspell // the unknown field named in the error
		{"one cluster, two addresses", []string{"--style", "cluster-header", "--workers-file", conflict}, false, "two addresses"},
		{"reserved cluster name", []string{"--style", "cluster-header", "--workers-file", reserved}, false, "reserved"},
		{"ext_proc address without port", []string{"--style", "original-dst", "--ext-proc-addr", "kvroute"}, false, "ext_proc address"},
		{"listener not an IP", []string{"--style", "original-dst", "--listen", "envoy:8080"}, false, "IP literals"},
		{"stray argument", []string{"--style", "xds", "extra"}, true, "unexpected argument"},
		{"unknown flag", []string{"--stile", "xds"}, true, "stile"},
		{"unknown response path", []string{"--style", "xds", "--response-path", "body"}, true, `--response-path "body": want observed, headers or streamed`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := runEnvoyConfig(context.Background(), c.args, &out, &errb)
			if err == nil {
				t.Fatalf("accepted %v and printed\n%s", c.args, out.String())
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
			if got := isUsageErr(err); got != c.usage {
				t.Errorf("usage error = %v, want %v (%v)", got, c.usage, err)
			}
			if out.Len() != 0 {
				t.Errorf("printed a bootstrap on error:\n%s", out.String())
			}
		})
	}
}

// isUsageErr reports whether err is a refused command line (exit 2).
func isUsageErr(err error) bool {
	var ue *cli.UsageError
	return errors.As(err, &ue)
}
