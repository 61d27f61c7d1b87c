package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
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
