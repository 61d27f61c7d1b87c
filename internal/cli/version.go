package cli

import (
	"runtime/debug"
	"strings"
)

// Version describes the running binary for `NAME --version`: the module
// version, the VCS revision and time (when `go build` stamped them; `go
// run` and `go test` do not) and the Go version, e.g.
//
//	kvroute github.com/kvroute/kvroute (devel) revision 97bd6e2c1a3f (modified) 2026-11-24T01:00:00Z go1.26.0
func Version(name string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return name + " (no build information)"
	}
	parts := []string{name, bi.Main.Path, orDefault(bi.Main.Version, "(devel)")}
	var rev, at, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		parts = append(parts, "revision unknown")
	} else {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		parts = append(parts, "revision "+rev)
		if modified == "true" {
			parts = append(parts, "(modified)")
		}
		if at != "" {
			parts = append(parts, at)
		}
	}
	parts = append(parts, bi.GoVersion)
	return strings.Join(parts, " ")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
