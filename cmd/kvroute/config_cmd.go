package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute/internal/cli"
)

const configUsage = `kvroute config — check and show kvroute serve's configuration file.

Usage:
  kvroute config validate FILE           check FILE with this environment's KVROUTE_* variables:
                                         keys, types, ranges, that serve would start (exit 0 when good)
  kvroute config print [serve flags...]  the effective configuration as YAML, each value
                                         with where it came from (default, file, env, flag)

The file has one key per serve flag (see docs/operating.md); print with
no --config shows every key with its default, a starting point for a file.
Precedence: flags > KVROUTE_* variables > the file > defaults.`

// runConfig is `kvroute config validate|print`.
func runConfig(_ context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	if len(args) == 0 {
		return &cli.UsageError{Err: fmt.Errorf("want validate FILE or print [flags]"), Cmd: "kvroute config"}
	}
	switch args[0] {
	case "validate":
		return validateConfig(args[1:], stdout, lookupEnv)
	case "print":
		return printConfig(args[1:], stdout, stderr, lookupEnv)
	case "help", "--help", "-h", "-help":
		fmt.Fprintln(stdout, configUsage)
		return nil
	}
	return &cli.UsageError{Err: fmt.Errorf("unknown config command %q (want validate or print)", args[0]), Cmd: "kvroute config"}
}

// validateConfig checks one file as serve would run it in this
// environment: the file and the KVROUTE_* variables, no other flags. A file
// that holds only the routing section is checked with the variables that
// supply the rest, as a Kubernetes pod gets them.
func validateConfig(args []string, stdout io.Writer, lookupEnv func(string) (string, bool)) error {
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
		fmt.Fprintln(stdout, configUsage)
		return nil
	}
	if len(args) != 1 {
		return &cli.UsageError{Err: fmt.Errorf("validate wants one FILE"), Cmd: "kvroute config"}
	}
	st, err := loadServe([]string{"--" + configFlag, args[0]}, io.Discard, io.Discard, lookupEnv, os.ReadFile)
	if err == nil {
		_, err = st.config(io.Discard)
	}
	if err != nil {
		return fmt.Errorf("invalid configuration:\n%w", notUsage(err))
	}
	fmt.Fprintf(stdout, "%s: valid (%d settings)\n", args[0], len(st.fromFile))
	return nil
}

// printConfig prints the configuration serve would run with these flags
// and this environment.
func printConfig(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	st, err := loadServe(args, stdout, stderr, lookupEnv, os.ReadFile)
	if err != nil {
		return err
	}
	if err := st.schema.Print(stdout, st.cmd.Flags, st.sources, func(f string) bool { return secretFlags[f] }); err != nil {
		return err
	}
	if _, err := st.config(io.Discard); err != nil {
		return fmt.Errorf("this configuration would not start: %w", notUsage(err))
	}
	return nil
}

// notUsage strips the usage-error wrapping: a bad file is not a bad
// command line, so it exits 1 without the pointer to --help.
func notUsage(err error) error {
	var ue *cli.UsageError
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
