package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/kvroute/kvroute/internal/cli"
	"io"
	"strings"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/envoy/envoytest"
)

// endpointList collects repeated --endpoint CLUSTER=HOST:PORT[,HOST:PORT] flags.
type endpointList map[string][]string

func (e endpointList) String() string {
	var parts []string
	for k, v := range e {
		parts = append(parts, k+"="+strings.Join(v, ","))
	}
	return strings.Join(parts, " ")
}

func (e endpointList) Set(s string) error {
	cluster, addrs, ok := strings.Cut(s, "=")
	if !ok || cluster == "" || addrs == "" {
		return fmt.Errorf("want CLUSTER=HOST:PORT[,HOST:PORT...], got %q", s)
	}
	e[cluster] = append(e[cluster], splitList(addrs)...)
	return nil
}

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bootstrap := fs.String("bootstrap", "envoy/cluster-header.yaml", "Envoy bootstrap YAML `file` to run (one of the files in envoy/, or kvroute envoy-config's output)")
	fs.StringVar(bootstrap, "c", *bootstrap, cli.Hidden+"--bootstrap, spelled as envoy -c")
	listen := fs.String("listen", "", "listener address replacing the bootstrap's, e.g. 127.0.0.1:8080 (empty: the bootstrap's)")
	eps := endpointList{}
	fs.Var(eps, "endpoint", "CLUSTER=HOST:PORT[,HOST:PORT...] replaces a cluster's endpoints (repeatable); the ext_proc cluster is \""+envoy.ExtProcClusterName+"\"")
	logFlags := cli.RegisterLog(fs, "info")
	setUsage(fs, `kvbench gateway runs the Envoy stand-in (package envoy's Gateway) from a
bootstrap file: an HTTP/1.1 and h2c front that sends every request through
kvroute's ext_proc gRPC service as Envoy does and routes it by the answer.
It is for development and tests where Envoy cannot be installed; production
uses Envoy with the same bootstrap. Runs until interrupted.`)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return err
	}
	g, err := envoytest.LoadGatewayFile(*bootstrap, envoytest.GatewayOptions{ListenAddress: *listen, Endpoints: eps, Logger: log})
	if err != nil {
		return err
	}
	if err := g.Start(ctx); err != nil {
		return err
	}
	defer g.Close()
	fmt.Fprintf(stdout, "kvbench gateway: %s serving on %s (Ctrl-C to stop)\n", *bootstrap, g.URL())
	<-ctx.Done()
	return nil
}
