// Command kvbench measures kvroute: it replays Mooncake-format traces and
// synthetic workloads (shared-prefix groups, multi-turn chat) against an
// OpenAI endpoint, compares router modes, and runs the whole system in one
// process for the demo.
//
//	kvbench demo     the whole stack: embedded NATS and etcd, kvsim workers, kvroute, a real Envoy
//	kvbench sim      the router, its index and simulated engines in virtual time: a load sweep per mode
//	kvbench replay   a workload against a running endpoint
//	kvbench up       the whole local stack in one process, until interrupted
//	kvbench hop      the latency kvroute adds to a request's path through Envoy
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvroute/kvroute/internal/cli"
)

const usage = `kvbench measures kvroute, the KV-cache-aware router for LLM fleets.

Usage:
  kvbench demo    [flags]   replay a real trace through an all-embedded fleet under several router modes
  kvbench sim     [flags]   sweep load × router mode in virtual time (deterministic; minutes for a whole trace)
  kvbench replay  [flags]   replay a workload against a running OpenAI endpoint (e.g. Envoy in front of kvroute)
  kvbench up      [flags]   start the whole local stack in this process and print a curl line to try
  kvbench hop     [flags]   measure the latency kvroute adds to a request's path through a real Envoy

  kvbench version           module version, VCS revision, Go version (also --version)

Run "kvbench <command> --help" for the flags of a command. Every flag can also be
set through the environment as KVROUTE_<FLAG> (dashes become underscores).
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, cli.Version("kvbench"))
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
	case "hop":
		err = runHop(ctx, args[1:], stdout, stderr)
	case "up":
		err = runUp(ctx, args[1:], stdout, stderr)
	default:
		err = cli.Usagef("unknown command %q (want demo, sim, replay, up, hop, version or help)", args[0])
		return cli.Exit("kvbench", err, stderr)
	}
	return cli.Exit("kvbench "+args[0], err, stderr)
}

// usages holds each subcommand's help summary, set by setUsage.
var usages = map[*flag.FlagSet]string{}

// setUsage records fs's help summary (what the command does; the flags are
// listed after it in the shared layout).
func setUsage(fs *flag.FlagSet, summary string) { usages[fs] = summary }

// parse reads args into fs, then KVROUTE_<FLAG> environment variables for
// the flags the command line did not set; --help and --version print on
// stdout.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	summary := strings.TrimRight(usages[fs], "\n") + "\n\nUsage:\n  " + fs.Name() + " [flags]"
	c := &cli.Command{Name: fs.Name(), Summary: summary, Flags: fs}
	return c.Parse(args, os.LookupEnv, stdout, false)
}
