package main

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/flagfile"
	"github.com/kvroute/kvroute/server"
)

// serveSetup is serve's flag set once the command line, the environment
// and the configuration file were read, in that order of precedence, with
// where each value came from.
type serveSetup struct {
	cmd    *cli.Command
	s      *serveFlags
	schema *flagfile.Schema
	// file is the --config file ("" none) and hash its bytes' SHA-256.
	file string
	hash [sha256.Size]byte
	// sources says where each flag's value came from; fromFile are the
	// file's values that were applied (the others lost to a flag or a
	// variable).
	sources  map[string]flagfile.Source
	fromFile []flagfile.Value
}

// loadServe reads serve's settings: the command line, then KVROUTE_*
// variables for flags it did not set, then the --config file (or
// KVROUTE_CONFIG) for flags neither set; the rest keep their defaults.
// --help prints on stdout; notes go to note; readFile reads the file.
func loadServe(args []string, stdout, note io.Writer, lookupEnv func(string) (string, bool), readFile func(string) ([]byte, error)) (*serveSetup, error) {
	cmd, s := newServeFlags()
	fs := cmd.Flags
	if err := cmd.Parse(args, nil, stdout, false); err != nil {
		return nil, err
	}
	st := &serveSetup{cmd: cmd, s: s, sources: map[string]flagfile.Source{}}
	fs.Visit(func(f *flag.Flag) { st.sources[f.Name] = flagfile.Source{Kind: flagfile.Flag} })
	if err := legacyEnv(fs, lookupEnv, note); err != nil {
		return nil, err
	}
	if err := applyEnv(fs, lookupEnv); err != nil {
		return nil, &cli.UsageError{Err: err, Cmd: "kvroute"}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		given[f.Name] = true
		if _, ok := st.sources[f.Name]; !ok {
			st.sources[f.Name] = flagfile.Source{Kind: flagfile.Env, Detail: envName(f.Name)}
		}
	})
	var err error
	if st.schema, err = serveSchema(fs); err != nil {
		return nil, err // a programming error: two flags with one key
	}
	if st.file = s.configFile; st.file != "" {
		data, err := readFile(st.file)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		st.hash = sha256.Sum256(data)
		vals, derr := st.schema.Decode(st.file, data)
		_, aerr := st.schema.Apply(fs, st.file, vals, given)
		if err := errors.Join(derr, aerr); err != nil {
			return nil, &cli.UsageError{Err: err, Cmd: "kvroute"}
		}
		for _, v := range vals {
			if !given[v.Flag] {
				st.fromFile = append(st.fromFile, v)
				st.sources[v.Flag] = flagfile.Source{Kind: flagfile.File, Detail: fmt.Sprintf("%s:%d", st.file, v.Line)}
			}
		}
	}
	s.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { s.given[f.Name] = true })
	return st, nil
}

// config builds the server.Config, naming the file's line in an error
// about a value the file set.
func (st *serveSetup) config(stderr io.Writer) (server.Config, error) {
	c, err := st.s.config(stderr)
	if err != nil {
		return c, st.attribute(err)
	}
	return c, nil
}

// attribute puts the file, line and key in front of err when err concerns
// a flag the file set: its message names the flag (--name) or its words
// ("queue max length" for router-queue-max-length's "queue ... length").
func (st *serveSetup) attribute(err error) error {
	msg := err.Error()
	var best *flagfile.Value
	for i, v := range st.fromFile {
		words := strings.ReplaceAll(v.Flag, "-", " ")
		words = strings.TrimPrefix(words, "router ")
		if strings.Contains(msg, "--"+v.Flag) || strings.Contains(msg, words) {
			if best == nil || len(v.Flag) > len(best.Flag) {
				best = &st.fromFile[i]
			}
		}
	}
	if best == nil {
		best = st.culprit()
	}
	if best == nil {
		return err
	}
	fe := &flagfile.Error{File: st.file, Line: best.Line, Key: best.Key, Err: err}
	var ue *cli.UsageError
	if errors.As(err, &ue) {
		return &cli.UsageError{Err: fe, Cmd: ue.Cmd}
	}
	return fe
}

// culprit finds the one file value without which the configuration
// builds, by putting each back to its default in turn: for errors whose
// message does not name the setting ("queue limits ... must not be
// negative"). Lists are skipped (a list flag cannot be reset).
func (st *serveSetup) culprit() *flagfile.Value {
	fs := st.cmd.Flags
	var found *flagfile.Value
	for i, v := range st.fromFile {
		f := fs.Lookup(v.Flag)
		if _, list := f.Value.(flagfile.Repeatable); list {
			continue
		}
		cur := f.Value.String()
		if fs.Set(v.Flag, f.DefValue) != nil {
			continue
		}
		_, err := st.s.config(io.Discard)
		_ = fs.Set(v.Flag, cur)
		if err == nil {
			if found != nil {
				return nil // two would do: no single culprit
			}
			found = &st.fromFile[i]
		}
	}
	return found
}

// values returns every flag's value as text, for comparing two loads.
func (st *serveSetup) values() map[string]string {
	out := map[string]string{}
	st.cmd.Flags.VisitAll(func(f *flag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// parseServe parses args, the environment and the configuration file into
// a server.Config; --help and --version print on stdout, notes and logs go
// to out.
func parseServe(args []string, stdout, out io.Writer, lookupEnv func(string) (string, bool)) (server.Config, error) {
	st, err := loadServe(args, stdout, out, lookupEnv, os.ReadFile)
	if err != nil {
		return server.Config{}, err
	}
	return st.config(out)
}
