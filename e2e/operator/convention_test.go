package operator

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// commands are every binary and subcommand that takes flags, as typed.
var commands = [][]string{
	{"kvroute"}, {"kvroute", "tokenize"}, {"kvroute", "envoy-config"},
	{"kvsim"}, {"kvbridge"},
	{"kvbench", "demo"}, {"kvbench", "sim"}, {"kvbench", "replay"}, {"kvbench", "up"},
}

var (
	flagLine   = regexp.MustCompile(`^  --[a-z0-9][a-z0-9-]*( [A-Za-z=.:_,\[\]-]+)?$`)
	detailLine = regexp.MustCompile(`^      \S`)
	// groupLine heads a group of flags (kvroute serve): " Start here:".
	groupLine = regexp.MustCompile(`^ [A-Z][A-Za-z ]*:$`)
)

// Every command's --help has the same layout: a summary with a Usage
// section, then "Flags:" and, per flag, "  --name VALUE" followed by
// indented lines, optionally under group headings (" Discovery:", a blank
// line before each but the first); never Go's one-dash form or
// "default default".
func TestHelpLayout(t *testing.T) {
	for _, c := range commands {
		name := strings.Join(c, " ")
		r := runBin(t, c[0], append(c[1:], "--help")...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("%s --help: exit %d, stderr %q", name, r.code, r.stderr)
			continue
		}
		if !strings.Contains(r.stdout, "Usage:\n") {
			t.Errorf("%s --help has no Usage section", name)
		}
		_, flags, ok := strings.Cut(r.stdout, "\nFlags:\n")
		if !ok {
			t.Errorf("%s --help has no Flags section:\n%s", name, r.stdout)
			continue
		}
		n := 0
		lines := strings.Split(flags, "\n")
		for i, line := range lines {
			if line == "" {
				if i+1 < len(lines) && groupLine.MatchString(lines[i+1]) {
					continue // the next group of flags
				}
				break // the footer follows a blank line
			}
			switch {
			case flagLine.MatchString(line):
				n++
			case detailLine.MatchString(line), groupLine.MatchString(line):
			default:
				t.Errorf("%s --help: line %q is not in the shared layout", name, line)
			}
		}
		if n < 3 {
			t.Errorf("%s --help lists %d flags", name, n)
		}
		for _, bad := range []string{"default default", "\n  -" + "h"} {
			if strings.Contains(r.stdout, bad) {
				t.Errorf("%s --help contains %q", name, bad)
			}
		}
		if !strings.Contains(r.stdout, "  --log-level") && c[0] != "kvroute" || c[0] == "kvroute" && len(c) == 1 && !strings.Contains(r.stdout, "  --log-format") {
			if c[0] != "kvbench" || c[1] == "demo" || c[1] == "up" {
				t.Errorf("%s --help has no --log-level/--log-format", name)
			}
		}
	}
}

var versionLine = regexp.MustCompile(`^(kvroute|kvsim|kvbridge|kvbench) github\.com/kvroute/kvroute \S+ revision ([0-9a-f]{12}|unknown)( \(modified\))?( \S+)? go1\.\d+`)

// --version and the version command print the module version, the VCS
// revision and the Go version on one line.
func TestVersion(t *testing.T) {
	// Go stamps the revision from a clone's .git folder; a checkout
	// without one (a tarball, or a `git worktree`, whose .git is a file Go
	// does not follow) is "revision unknown".
	want := "revision unknown"
	if st, err := os.Stat(filepath.Join("..", "..", ".git")); err == nil && st.IsDir() {
		if out, err := exec.Command("git", "-C", filepath.Join("..", ".."), "rev-parse", "HEAD").Output(); err == nil {
			want = "revision " + string(out[:12])
		}
	}
	for _, b := range []string{"kvroute", "kvsim", "kvbridge", "kvbench"} {
		for _, args := range [][]string{{"--version"}, {"version"}} {
			r := runBin(t, b, args...)
			if r.code != 0 || !versionLine.MatchString(r.stdout) || !strings.Contains(r.stdout, want) {
				t.Errorf("%s %v: exit %d, %q (stderr %q)", b, args, r.code, r.stdout, r.stderr)
			}
		}
	}
}

// A refused command line prints the error first, GNU-spelled, then one
// line pointing to --help, and exits 2; lists read as prose.
func TestErrorForm(t *testing.T) {
	for _, c := range commands {
		name := strings.Join(c, " ")
		r := runBin(t, c[0], append(c[1:], "--no-such-flag")...)
		want := name + ": flag provided but not defined: --no-such-flag\nRun '" + name + " --help' for usage.\n"
		if r.code != 2 || r.stderr != want || r.stdout != "" {
			t.Errorf("%s --no-such-flag: exit %d, stderr %q, stdout %d bytes; want exit 2 and %q", name, r.code, r.stderr, len(r.stdout), want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"kvroute", "--workers-file", "w.yaml", "--router-mode", "magic"}, "kv, "},
		{[]string{"kvroute", "envoy-config"}, "cluster-header, original-dst or xds"},
		{[]string{"kvroute", "--log-format", "xml", "--workers-file", "w.yaml"}, "text or json"},
		{[]string{"kvsim", "--workers", "many"}, "--workers"},
		{[]string{"kvbench", "sim", "--modes", "fastest"}, "fastest"},
		{[]string{"kvbridge", "--engine", "tgi"}, "tgi"},
	} {
		r := runBin(t, tc.args[0], tc.args[1:]...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "[") {
			t.Errorf("%v: exit %d, stderr %q; want an error with %q and no Go slice", tc.args, r.code, r.stderr, tc.want)
		}
		if strings.Count(r.stderr, "\n") > 3 {
			t.Errorf("%v printed %d lines for one error:\n%s", tc.args, strings.Count(r.stderr, "\n"), r.stderr)
		}
	}
}

// A boolean is one flag that takes --x=false; the old --no-kv-events is a
// hidden alias that still works.
func TestBooleanFlags(t *testing.T) {
	r := runBin(t, "kvroute", "--help-all")
	if strings.Contains(r.stdout, "--no-kv-events") || !strings.Contains(r.stdout, "--kv-events=false") {
		t.Errorf("kvroute --help-all shows --no-kv-events or does not explain --kv-events=false")
	}
}
