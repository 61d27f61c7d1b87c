package envoytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/envoy"
)

// readShipped returns a bootstrap shipped beside package envoy.
func readShipped(t testing.TB, style string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", style+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// breakVariant replaces old with new in a shipped bootstrap, failing the test
// if old is not there (so a broken variant can never silently equal the original).
func breakVariant(t *testing.T, src, old, new string) string {
	t.Helper()
	if !strings.Contains(src, old) {
		t.Fatalf("variant anchor %q not found", old)
	}
	return strings.Replace(src, old, new, 1)
}

// A valid bootstrap either loads into the Gateway or is refused with an error.
func FuzzGatewayConfig(f *testing.F) {
	for _, s := range envoy.Styles {
		f.Add(readShipped(f, s))
	}
	f.Add("{}")
	f.Add("static_resources: {listeners: [{name: x}]}")
	f.Add("static_resources: {clusters: [{name: a, type: ORIGINAL_DST}]}")
	f.Fuzz(func(t *testing.T, src string) {
		b, err := envoy.Validate([]byte(src))
		if err != nil {
			return
		}
		_, _ = buildGatewayConfig(b, GatewayOptions{})
	})
}
