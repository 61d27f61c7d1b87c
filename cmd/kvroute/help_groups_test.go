package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// A new serve flag must be put under a heading, not left to "Other".
func TestServeHelpGroupsEveryFlag(t *testing.T) {
	cmd, _ := newServeFlags()
	if rest := cmd.Ungrouped(); len(rest) > 0 {
		t.Errorf("serve flags in no help group (add them to serveGroups): %v", rest)
	}
	seen := map[string]string{}
	for _, g := range serveGroups {
		for _, f := range g.Flags {
			if cmd.Flags.Lookup(f) == nil {
				t.Errorf("group %q names --%s, which serve does not have", g.Title, f)
			}
			if prev, ok := seen[f]; ok {
				t.Errorf("--%s is in both %q and %q", f, prev, g.Title)
			}
			seen[f] = g.Title
		}
	}
	var out bytes.Buffer
	cmd.UsageAll(&out)
	help := out.String()
	last := -1
	for _, title := range []string{"Start here", "Discovery", "Events", "Routing cost", "Requests", "Limits", "Security", "Observability"} {
		i := strings.Index(help, "\n "+title+":\n")
		if i < 0 || i < last {
			t.Errorf("help lacks the heading %q in its place", title)
		}
		last = i
	}
	if strings.Contains(help, " Other:") {
		t.Errorf("help has an Other group")
	}
}

// --help shows the first-run and infrastructure flags only (about 30) and
// says where the rest are.
func TestServeBriefHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help"}, nil, &out, &out, envOf(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	help := out.String()
	cmd, _ := newServeFlags()
	shown := 0
	cmd.Flags.VisitAll(func(f *flag.Flag) {
		if strings.Contains(help, "\n  --"+f.Name+" ") || strings.Contains(help, "\n  --"+f.Name+"\n") {
			shown++
		}
	})
	if shown > 30 || shown < 20 {
		t.Errorf("--help shows %d flags, want 20 to 30", shown)
	}
	for _, want := range []string{"--help-all", "configuration file", "--config", "--router-mode", "--tls-cert", "--log-level"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	for _, g := range serveBrief {
		for _, f := range g.Flags {
			if cmd.Flags.Lookup(f) == nil {
				t.Errorf("brief group %q names --%s, which serve does not have", g.Title, f)
			}
		}
	}
	if strings.Contains(help, "--prefill-rate") {
		t.Errorf("--help shows a cost parameter")
	}
}
