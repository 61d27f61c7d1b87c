package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// The admin listener is apart from metrics and health, and with a token
// set it answers 401 to anyone without it.
func TestAdminListenerNeedsItsToken(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 1)
	cfg.AdminToken = "s3cret-token"
	r := start(t, cfg)
	eventually(t, "ready", r.Ready)
	if r.AdminAddr() == r.HTTPAddr() || r.AdminAddr() == "" {
		t.Fatalf("admin %q and http %q must be two listeners", r.AdminAddr(), r.HTTPAddr())
	}
	admin := "http://" + r.AdminAddr()
	do := func(method, url, auth string) int {
		req, _ := http.NewRequest(method, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		method, path, auth string
		want               int
	}{
		{"GET", "/debug/workers", "", 401},
		{"GET", "/debug/workers", "Bearer wrong", 401},
		{"GET", "/debug/workers", "s3cret-token", 401}, // no scheme
		{"POST", "/admin/mode?mode=round_robin", "", 401},
		{"GET", "/debug/workers", "Bearer s3cret-token", 200},
		{"GET", "/admin/mode", "Bearer s3cret-token", 200},
	} {
		if got := do(tc.method, admin+tc.path, tc.auth); got != tc.want {
			t.Errorf("%s %s with %q: %d, want %d", tc.method, tc.path, tc.auth, got, tc.want)
		}
	}
	if r.Mode() == "round_robin" {
		t.Error("an unauthenticated POST /admin/mode switched the mode")
	}
	// Probes and scrapers need no token.
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if got := do("GET", "http://"+r.HTTPAddr()+p, ""); got != 200 {
			t.Errorf("GET %s: %d, want 200 without a token", p, got)
		}
	}
}

// A serve/shutdown cycle with every listener on (ext_proc, HTTP, admin,
// xDS, embedded NATS) ends with a nil error: no component reports its own
// listener's closing as a failure. Repeated, since the race it guards
// against (a listener closed before its server marks itself stopped) does
// not show every time.
func TestServeShutdownCycleIsClean(t *testing.T) {
	for i := range 5 {
		cfg := testConfig(t)
		cfg.WorkersFile = workersFile(t, 2)
		cfg.XDSAddr = "127.0.0.1:0"
		ctx, cancel := context.WithCancel(context.Background())
		r, err := Start(ctx, cfg)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		eventually(t, "ready", r.Ready)
		if _, status := route(t, dial(t, r), chatBody(3)); status != 200 {
			t.Fatalf("cycle %d: route status %d", i, status)
		}
		cancel()
		if err := r.Wait(); err != nil {
			t.Fatalf("cycle %d: shutdown ended with %v, want nil", i, err)
		}
		for _, addr := range []string{r.HTTPAddr(), r.AdminAddr()} {
			if _, err := http.Get("http://" + addr + "/healthz"); err == nil || !strings.Contains(err.Error(), "refused") {
				t.Errorf("cycle %d: %s still answers after shutdown (%v)", i, addr, err)
			}
		}
	}
}
