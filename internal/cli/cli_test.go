package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestLoggerFormatsAndDurations(t *testing.T) {
	for _, tc := range []struct {
		format, want string
	}{
		{"", `"grace":"15s"`}, // not a terminal: JSON
		{"json", `"grace":"15s"`},
		{"text", `grace=15s`},
	} {
		var buf bytes.Buffer
		log, err := (&LogFlags{Format: tc.format, Level: "info"}).Logger(&buf)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("draining", "grace", 15*time.Second)
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("format %q: %q lacks %s", tc.format, buf.String(), tc.want)
		}
		if tc.format != "text" && !json.Valid(bytes.TrimSpace(buf.Bytes())) {
			t.Errorf("format %q is not JSON: %s", tc.format, buf.String())
		}
	}
	for _, bad := range []LogFlags{{Format: "xml", Level: "info"}, {Level: "loud"}} {
		var ue *UsageError
		if _, err := bad.Logger(&bytes.Buffer{}); !errors.As(err, &ue) {
			t.Errorf("%+v: err %v, want a usage error", bad, err)
		}
	}
}

func TestParseErrorsAreGNUAndHelpGoesToStdout(t *testing.T) {
	c := NewCommand("demo", "demo does things.\n\nUsage:\n  demo [flags]")
	n := c.Flags.Int("count", 3, "how many")
	c.Flags.Bool("old", false, Hidden+"gone")
	env := map[string]string{"KVROUTE_COUNT": "5"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	var out bytes.Buffer
	if err := c.Parse(nil, lookup, &out, false); err != nil || *n != 5 {
		t.Fatalf("env: err %v, count %d", err, *n)
	}
	for args, want := range map[string]string{
		"--nope":        "flag provided but not defined: --nope",
		"--count=x":     `invalid value "x" for flag --count`,
		"extra":         `unexpected argument "extra"`,
		"--count 1 a b": `unexpected argument "a" and "b"`,
	} {
		err := c.Parse(strings.Fields(args), nil, &out, false)
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), want) || ue.Cmd != "demo" {
			t.Errorf("%s: %v, want a usage error of demo with %q", args, err, want)
		}
	}
	out.Reset()
	if err := c.Parse([]string{"--help"}, nil, &out, false); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "  --count int\n      how many\n      env KVROUTE_COUNT, default 3\n") || strings.Contains(out.String(), "--old") {
		t.Errorf("help:\n%s", out.String())
	}
	var errb bytes.Buffer
	if code := Exit("demo", c.Parse([]string{"--nope"}, nil, &out, false), &errb); code != 2 ||
		errb.String() != "demo: flag provided but not defined: --nope\nRun 'demo --help' for usage.\n" {
		t.Errorf("exit %d, %q", code, errb.String())
	}
}

func TestList(t *testing.T) {
	for want, items := range map[string][]string{"": nil, "a": {"a"}, "a or b": {"a", "b"}, "a, b or c": {"a", "b", "c"}} {
		if got := List(items, "or"); got != want {
			t.Errorf("List(%v) = %q, want %q", items, got, want)
		}
	}
}

func TestUnknownFlagSuggestsTheClosest(t *testing.T) {
	c := NewCommand("demo", "demo")
	c.Flags.String("workers-file", "", "file")
	c.Flags.String("workers", "", "list")
	c.Flags.Bool("verbose", false, "more")
	c.Flags.Bool("old-name", false, Hidden+"gone")
	for args, want := range map[string]string{
		"--worker-file":  "flag provided but not defined: --worker-file; did you mean --workers-file?",
		"--workres":      "flag provided but not defined: --workres; did you mean --workers?",
		"-verbos":        "flag provided but not defined: --verbos; did you mean --verbose?",
		"--verb":         "flag provided but not defined: --verb; did you mean --verbose?", // the only flag it starts
		"--old-nam":      "flag provided but not defined: --old-nam",                       // hidden flags are not offered
		"--tokenizer-id": "flag provided but not defined: --tokenizer-id",                  // nothing close
	} {
		err := c.Parse([]string{args}, nil, io.Discard, false)
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}

func TestGroupedHelp(t *testing.T) {
	c := NewCommand("demo", "demo.\n\nUsage:\n  demo")
	c.Flags.Int("b", 0, "b")
	c.Flags.Int("a", 0, "a")
	c.Flags.Int("stray", 0, "not grouped")
	c.Flags.Int("gone", 0, Hidden+"hidden")
	c.Groups = []Group{{Title: "First", Flags: []string{"b"}}, {Title: "Second", Flags: []string{"a", "gone"}}}
	var out bytes.Buffer
	c.Usage(&out)
	want := "demo.\n\nUsage:\n  demo\n\nFlags:\n First:\n  --b int\n      b\n      env KVROUTE_B\n\n Second:\n  --a int\n      a\n      env KVROUTE_A\n\n Other:\n  --stray int\n      not grouped\n      env KVROUTE_STRAY\n"
	if out.String() != want {
		t.Errorf("help:\n%s\nwant:\n%s", out.String(), want)
	}
	if got := c.Ungrouped(); len(got) != 1 || got[0] != "stray" {
		t.Errorf("Ungrouped = %v, want [stray]", got)
	}
}

func TestBriefHelpAndHelpAll(t *testing.T) {
	c := NewCommand("demo", "demo.")
	c.Flags.Int("a", 0, "a")
	c.Flags.Int("b", 0, "b")
	c.Groups = []Group{{Title: "All", Flags: []string{"a", "b"}}}
	c.Brief = []Group{{Title: "Start", Flags: []string{"a"}}}
	c.BriefFooter = "More: --help-all."
	var brief, all bytes.Buffer
	if err := c.Parse([]string{"--help"}, nil, &brief, false); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if err := c.Parse([]string{"--help-all"}, nil, &all, false); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if s := brief.String(); !strings.Contains(s, " Start:\n  --a") || strings.Contains(s, "--b") || !strings.HasSuffix(s, "More: --help-all.\n") {
		t.Errorf("--help:\n%s", s)
	}
	if s := all.String(); !strings.Contains(s, " All:\n  --a int") || !strings.Contains(s, "--b") || strings.Contains(s, "More:") {
		t.Errorf("--help-all:\n%s", s)
	}
}
