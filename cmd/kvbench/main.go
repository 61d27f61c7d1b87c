// Command kvbench measures kvroute: it replays Mooncake-format traces and
// synthetic workloads (shared-prefix groups, multi-turn chat) against an
// OpenAI endpoint, compares router modes, and runs the whole system in one
// process for the demo.
//
//	kvbench demo     everything embedded: NATS, etcd, kvsim workers, kvroute, the Envoy stand-in
//	kvbench sim      the router, its index and simulated engines in virtual time: a load sweep per mode
//	kvbench replay   a workload against a running endpoint
//	kvbench gateway  the Envoy stand-in, standalone, from a bootstrap file
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvroute/kvroute/internal/envflag"
)

const usage = `kvbench measures kvroute, the KV-cache-aware router for LLM fleets.

Usage:
  kvbench demo    [flags]   replay a real trace through an all-embedded fleet under several router modes
  kvbench sim     [flags]   sweep load × router mode in virtual time (deterministic; minutes for a whole trace)
  kvbench replay  [flags]   replay a workload against a running OpenAI endpoint (e.g. Envoy in front of kvroute)
  kvbench gateway [flags]   run the Envoy stand-in (development only) from a bootstrap file

Run "kvbench <command> -help" for the flags of a command. Every flag can also be
set through the environment as KVROUTE_<FLAG> (dashes become underscores).
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "demo":
		err = runDemo(ctx, args[1:], stdout, stderr)
	case "replay":
		err = runReplay(ctx, args[1:], stdout, stderr)
	case "sim":
		err = runSim(ctx, args[1:], stdout, stderr)
	case "gateway":
		err = runGateway(ctx, args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "kvbench: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "kvbench %s: %v\n", args[0], err)
	return 1
}

// errUsage marks a command line that was already reported.
var errUsage = errors.New("usage")

// parse parses args into fs after applying KVROUTE_<FLAG> environment
// variables, so the command line wins over the environment.
func parse(fs *flag.FlagSet, args []string) error {
	if err := envflag.Apply(fs, os.LookupEnv, nil); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return errUsage
	}
	return nil
}

// logger logs to stderr at the given level ("off" discards).
func logger(stderr io.Writer, level string) (*slog.Logger, error) {
	if level == "off" || level == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil)), nil
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l})), nil
}
