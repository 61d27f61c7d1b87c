package main

import (
	"bytes"
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
	cmd.Usage(&out)
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
