package proxy

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/envoy"
)

func TestFindRefusesANonExecutable(t *testing.T) {
	f := filepath.Join(t.TempDir(), "envoy")
	if err := os.WriteFile(f, []byte("not a binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar, f)
	if _, err := Find(); err == nil || !strings.Contains(err.Error(), EnvVar) {
		t.Errorf("Find with a non-executable %s: %v, want an error naming the variable", EnvVar, err)
	}
}

// A bootstrap Envoy refuses is an error that quotes Envoy's own reason.
func TestStartReportsEnvoysReason(t *testing.T) {
	_, err := Start(context.Background(), Config{Bootstrap: []byte("static_resources: {clusters: [{name: x, type: NO_SUCH_TYPE}]}\n")})
	if err == nil || !strings.Contains(err.Error(), "NO_SUCH_TYPE") {
		t.Errorf("Start with a bad bootstrap: %v, want Envoy's complaint about NO_SUCH_TYPE", err)
	}
}

// A generated bootstrap on free ports: Envoy is ready, its listener
// answers, its stats are read, and Close stops it.
func TestStartServesAGeneratedBootstrap(t *testing.T) {
	data, err := envoy.Generate(envoy.StyleOriginalDst, nil, envoy.Options{ListenAddress: "127.0.0.1:0", AdminAddress: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(context.Background(), Config{Bootstrap: data, Listener: "llm"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(p.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// kvroute is not running: original-dst fails closed.
	if resp.StatusCode < 500 {
		t.Errorf("status %d with no ext_proc server, want a 5xx (fail closed)", resp.StatusCode)
	}
	n, err := p.Stat(context.Background(), "http.llm.downstream_rq_total")
	if err != nil || n != 1 {
		t.Errorf("downstream_rq_total = %d, %v; want 1", n, err)
	}
	p.Close()
	if _, err := http.Get(p.AdminURL() + "/ready"); err == nil {
		t.Error("Envoy's admin API still answers after Close")
	}
}
