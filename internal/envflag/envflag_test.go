package envflag

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func newSet() (*flag.FlagSet, *int, *string) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.Int("max-num-seqs", 1, "")
	s := fs.String("nats-url", "x", "")
	return fs, n, s
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestNameUpperCasesAndUnderscores(t *testing.T) {
	if got := Name("max-num-seqs"); got != "KVROUTE_MAX_NUM_SEQS" {
		t.Fatalf("Name = %q", got)
	}
}

func TestEnvironmentSetsUnsetFlags(t *testing.T) {
	fs, n, s := newSet()
	if err := Apply(fs, env(map[string]string{"KVROUTE_MAX_NUM_SEQS": "7", "KVROUTE_NATS_URL": ""}), nil); err != nil {
		t.Fatal(err)
	}
	if *n != 7 || *s != "x" {
		t.Fatalf("got %d %q; an empty variable must leave the default", *n, *s)
	}
}

func TestCommandLineWins(t *testing.T) {
	fs, n, _ := newSet()
	if err := fs.Parse([]string{"--max-num-seqs", "3"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, env(map[string]string{"KVROUTE_MAX_NUM_SEQS": "7"}), nil); err != nil {
		t.Fatal(err)
	}
	if *n != 3 {
		t.Fatalf("environment overrode the command line: %d", *n)
	}
}

func TestBadValueNamesTheVariable(t *testing.T) {
	fs, _, _ := newSet()
	err := Apply(fs, env(map[string]string{"KVROUTE_MAX_NUM_SEQS": "many"}), nil)
	if err == nil || !strings.Contains(err.Error(), "KVROUTE_MAX_NUM_SEQS") {
		t.Fatalf("err = %v", err)
	}
}

func TestCustomNames(t *testing.T) {
	fs, _, s := newSet()
	rename := func(f string) string {
		if f == "nats-url" {
			return "KVROUTE_NATS_URLS"
		}
		return Name(f)
	}
	if err := Apply(fs, Getenv(func(k string) string { return map[string]string{"KVROUTE_NATS_URLS": "y", "KVROUTE_NATS_URL": "z"}[k] }), rename); err != nil {
		t.Fatal(err)
	}
	if *s != "y" {
		t.Fatalf("got %q", *s)
	}
}

func TestParseRefusesPositionalArguments(t *testing.T) {
	fs, n, _ := newSet()
	err := Parse(fs, []string{"--max-num-seqs", "4", "extra"}, env(map[string]string{"KVROUTE_MAX_NUM_SEQS": "9"}))
	if err == nil || !strings.Contains(err.Error(), "extra") {
		t.Fatalf("err = %v", err)
	}
	if *n != 4 {
		t.Fatalf("command line should win over the environment: %d", *n)
	}
}
