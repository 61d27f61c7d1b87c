package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/kvroute/kvroute/discovery/file"
	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/cli"
)

const envoyConfigUsage = `Usage:
  kvroute envoy-config --style cluster-header|original-dst|xds [flags]

Prints an Envoy bootstrap (YAML) that puts kvroute in front of the fleet as an
ext_proc filter. The output passes the same checks as the bootstraps shipped in
envoy/ (Envoy's protos, every Any unpacked and validated, kvroute's rules).

  cluster-header  one static cluster per worker of --workers-file, picked by x-target-worker;
                  workers² endpoints, for small static fleets (use xds beyond ~50 workers)
  original-dst    an ORIGINAL_DST cluster on x-gateway-destination-endpoint (Gateway API style)
  xds             one worker cluster, kvroute_workers, served by kvroute's ADS server
                  (kvroute --xds-addr) and following discovery; for big fleets

cluster-header and xds retry a refused connection (or a reset before the
response headers) once, on the next endpoint of kvroute's list (its runner-up,
see --fallbacks); original-dst cannot retry on another worker.

Envoy waits on kvroute once per request (--response-path observed, the
default): for its answer to the request body, which carries the route.
cluster-header and xds skip the request headers (what kvroute reads of them
comes as request attributes with the body; a buffer filter holds the request
until the answer is in); original-dst streams the body in
FULL_DUPLEX_STREAMED mode, so Envoy sends the headers and the body chunks and
waits for the one answer after the last. The response headers (status, who
made the response, the endpoint that served) reach kvroute through a second
ext_proc filter in observability mode, which Envoy does not wait on; the body
goes to the client without waiting on kvroute, and the request's load is
freed when the routing stream ends with the response. With several kvroute
replicas behind one Envoy, the observing filter's report may reach another
replica than the one that routed; replicas forward such reports to each other
over NATS (without NATS, use --response-path headers with several replicas).
--response-path headers sends the request headers and the response headers
on the routing stream, each an exchange Envoy waits on (3 per request; 4
messages for original-dst). --response-path streamed sends every body chunk
too (one round trip each): the first token then also counts at the first
chunk, and decode progress at the SSE events. Otherwise the first token
counts at the worker's KV event for the prompt's last block.

Unlike serve, envoy-config reads no environment variables: it is run once to
write a file, and KVROUTE_ADMIN_ADDR or KVROUTE_XDS_ADDR meant for another
command must not change that file.`

// runEnvoyConfig implements `kvroute envoy-config`: it renders a bootstrap
// of the chosen style with envoy.Generate and writes it to stdout.
func runEnvoyConfig(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := cli.NewCommand("kvroute envoy-config", envoyConfigUsage)
	cmd.Env = func(string) string { return "" }
	fs := cmd.Flags
	var (
		style, workersFile string
		opts               envoy.Options
		tls                envoy.TLSFiles
	)
	fs.StringVar(&style, "style", "", "bootstrap style: "+cli.List(envoy.Styles, "or"))
	fs.StringVar(&workersFile, "workers-file", "", "static YAML or JSON `file` of worker records (required by cluster-header)")
	fs.StringVar(&opts.ExtProcAddress, "ext-proc-addr", "127.0.0.1:9002", "kvroute's ext_proc gRPC `host:port` as Envoy dials it")
	fs.StringVar(&opts.ListenAddress, "listen", "0.0.0.0:8080", "Envoy's listener `ip:port`")
	fs.StringVar(&opts.AdminAddress, "admin-addr", "127.0.0.1:9901", "Envoy's admin `ip:port`")
	fs.StringVar(&opts.XDSAddress, "xds-addr", "127.0.0.1:18000", "kvroute's ADS `host:port` (style xds)")
	fs.StringVar(&opts.NodeID, "node-id", envoy.DefaultNodeID, "Envoy's node id (style xds: must match kvroute's)")
	fs.StringVar(&opts.ResponsePath, "response-path", envoy.ResponsePathObserved, "what of each response Envoy sends kvroute: "+
		"headers (status, who answered, the endpoint that served; the body goes to the client without waiting on kvroute, and the first token counts at the worker's KV event for the prompt's last block) or "+
		"streamed (every body chunk too: the first token also at the first chunk, and decode progress, at one round trip per chunk)")
	fs.DurationVar(&opts.MessageTimeout, "message-timeout", 60*time.Second, "ext_proc message_timeout; must exceed kvroute's admission-queue wait")
	fs.StringVar(&tls.CAFile, "ext-proc-tls-ca", "", "CA `file` (on Envoy's machine) that signs kvroute's --tls-cert: Envoy dials ext_proc over TLS")
	fs.StringVar(&tls.CertFile, "ext-proc-tls-cert", "", "Envoy's client certificate `file` for kvroute's --tls-client-ca (mutual TLS)")
	fs.StringVar(&tls.KeyFile, "ext-proc-tls-key", "", "Envoy's client key `file` (with --ext-proc-tls-cert)")
	fs.StringVar(&tls.SNI, "ext-proc-tls-sni", "", "server `name` Envoy sends and requires in kvroute's certificate")
	if err := cmd.Parse(args, nil, stdout, false); err != nil {
		return err
	}
	if style == "" {
		return cmd.Usagef("--style is required (%s)", cli.List(envoy.Styles, "or"))
	}
	if !slices.Contains(envoy.ResponsePaths, opts.ResponsePath) {
		return cmd.Usagef("--response-path %q: want %s", opts.ResponsePath, cli.List(envoy.ResponsePaths, "or"))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var workers []envoy.Worker
	if workersFile != "" {
		recs, err := file.Load(workersFile)
		if err != nil {
			return fmt.Errorf("envoy-config: %w", err)
		}
		if workers, err = envoyWorkers(recs); err != nil {
			return fmt.Errorf("envoy-config: %s: %w", workersFile, err)
		}
	}
	if tls != (envoy.TLSFiles{}) {
		if tls.CAFile == "" {
			return cmd.Usagef("--ext-proc-tls-cert, --ext-proc-tls-key and --ext-proc-tls-sni need --ext-proc-tls-ca")
		}
		opts.ExtProcTLS = &tls
	}
	if style == envoy.StyleClusterHeader && len(workers) == 0 {
		return cmd.Usagef("style %s needs --workers-file with at least one worker", style)
	}
	out, err := envoy.Generate(style, workers, opts)
	if err != nil {
		return fmt.Errorf("envoy-config: %w", err)
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("envoy-config: write: %w", err)
	}
	return nil
}

// envoyWorkers maps worker records onto the clusters Envoy needs, one per
// cluster name. Records may share a cluster (data-parallel ranks behind one
// API server) only if they share its address too.
func envoyWorkers(recs []fleet.Worker) ([]envoy.Worker, error) {
	addr := map[string]string{}
	var out []envoy.Worker
	for _, r := range recs {
		c := r.ClusterName()
		if a, ok := addr[c]; ok {
			if a != r.Address {
				return nil, fmt.Errorf("cluster %q has two addresses, %s and %s (worker %s)", c, a, r.Address, r.ID)
			}
			continue
		}
		addr[c] = r.Address
		out = append(out, envoy.Worker{Cluster: c, Address: r.Address})
	}
	return out, nil
}
