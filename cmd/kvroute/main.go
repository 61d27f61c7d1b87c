// Command kvroute is the KV-cache-aware router for LLM inference fleets: an
// Envoy ext_proc server that sends every OpenAI-style request to the GPU
// worker that already holds most of its prompt's KV cache, weighed against
// load.
//
//	kvroute [serve] [flags]   run the router (the default)
//	kvroute tokenize ...      print token ids as the router computes them
//	kvroute envoy-config ...  print an Envoy bootstrap for kvroute
//	kvroute config ...        validate a configuration file, print the effective one
//	kvroute version           print the version
//	kvroute help              explain every flag
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/kvroute/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(cli.Exit("kvroute", err, os.Stderr))
}

// run dispatches the subcommand; lookupEnv reads KVROUTE_* variables.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return runServe(ctx, args, stdout, stderr, lookupEnv)
	case "tokenize":
		return runTokenize(ctx, args, stdin, stdout, stderr, lookupEnv)
	case "envoy-config":
		return runEnvoyConfig(ctx, args, stdout, stderr)
	case "config":
		return runConfig(ctx, args, stdout, stderr, lookupEnv)
	case "help":
		// `kvroute help` explains every flag, as --help-all does.
		if err := runServe(ctx, []string{"--help-all"}, stdout, stderr, lookupEnv); !errors.Is(err, flag.ErrHelp) {
			return err
		}
		return nil
	case "version":
		fmt.Fprintln(stdout, cli.Version("kvroute"))
		return nil
	}
	return cli.Usagef("unknown command %q (want serve, tokenize, envoy-config, config, version or help)", cmd)
}
