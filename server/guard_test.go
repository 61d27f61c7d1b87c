package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	natsserver "github.com/nats-io/nats-server/v2/server"
	clientv3 "go.etcd.io/etcd/client/v3"
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

func TestNamespaceWildcardsAreRefused(t *testing.T) {
	for _, ns := range []string{"*", ">", "a.b", "a b", "prod\n"} {
		cfg := testConfig(t)
		cfg.WorkersFile = workersFile(t, 1)
		cfg.Namespace = ns
		_, err := Start(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), "namespace") {
			t.Errorf("namespace %q: %v, want a namespace error", ns, err)
		}
	}
}

// Hostile etcd records (CR/LF in the cluster, a metadata address, a
// wildcard id, the metadata address spelt in octal, hex, as one integer,
// in a short form or with a trailing dot) never join the fleet; each is
// logged and counted, and a
// good record beside them is served. An allowed range lets an operator
// opt in to a link-local worker.
func TestHostileEtcdRecordsAreRefused(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.EtcdEndpoints, cfg.NATSURL = e.Endpoints, n.URL
	cfg.AllowAddressRanges = []netip.Prefix{netip.MustParsePrefix("169.254.7.0/24")}
	var logs testenv.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(id, value string) {
		if _, err := cli.Put(context.Background(), bus.WorkerKey(cfg.Namespace, id), value); err != nil {
			t.Fatal(err)
		}
	}
	rec := func(id, cluster, addr string) string {
		b, _ := json.Marshal(map[string]any{"id": id, "model": model, "address": addr, "cluster": cluster, "block_size": 16})
		return string(b)
	}
	put("crlf", rec("crlf", "w0\r\nx-target-worker: kvroute", "10.0.0.1:8000"))
	put("meta", rec("meta", "", "169.254.169.254:80"))
	put("nul", rec("nul", "", "10.0.0.2:8000\x00"))
	put("*", rec("*", "", "10.0.0.3:8000"))
	// Other spellings of the metadata address, which a getaddrinfo
	// resolver turns into 169.254.169.254.
	put("octal", rec("octal", "", "0251.0376.0251.0376:80"))
	put("integer", rec("integer", "", "2852039166:80"))
	put("hex", rec("hex", "", "0xa9fea9fe:80"))
	put("dot", rec("dot", "", "169.254.169.254.:80"))
	put("short", rec("short", "", "169.254.43518:80"))
	put("ok", rec("ok", "", "10.0.0.4:8000"))
	put("optin", rec("optin", "", "169.254.7.9:8000"))
	eventually(t, "the good and opted-in records", func() bool { return r.fleet.len() == 2 })
	bad := func() float64 {
		text := get(t, "http://"+r.HTTPAddr()+"/metrics", 200)
		for _, line := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(line, `kvroute_discovery_bad_records_total{source="etcd"} `); ok {
				var f float64
				fmt.Sscan(v, &f)
				return f
			}
		}
		return 0
	}
	eventually(t, "nine refused records counted", func() bool { return bad() == 9 })
	ids := map[string]bool{}
	for _, rec := range r.fleet.snapshot() {
		ids[rec.ID] = true
	}
	if !ids["ok"] || !ids["optin"] || len(ids) != 2 {
		t.Errorf("fleet %v, want ok and optin", ids)
	}
	out := logs.String()
	for _, want := range []string{"ignoring bad worker record", "cluster", "169.254.0.0/16", "control characters", `0xa9fea9fe:80\" is 169.254.169.254`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\r\nx-target-worker") {
		t.Error("a log line repeats the record's CR/LF verbatim")
	}
	if w, status := route(t, dial(t, r), chatBody(3)); status != 200 || (w != "ok" && w != "optin") {
		t.Errorf("routed to %q (%d)", w, status)
	}
}

// The router authenticates to a NATS server that requires a user and
// password, refuses to start with a wrong one, and the startup config log
// line shows neither the password nor the admin token.
func TestNATSUserPasswordAuthAndRedactedConfigLog(t *testing.T) {
	const user, pass, token = "kvroute", "nats-pa55-Zq9", "admin-t0ken-Xy7"
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true,
		Username: user, Password: pass})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(ns.Shutdown)

	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 1)
	cfg.NATSURL, cfg.NATSUser, cfg.NATSPassword = ns.ClientURL(), user, "wrong"
	if _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("wrong password: %v, want an authorization error", err)
	}

	var logs testenv.SyncBuffer
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	cfg.NATSPassword, cfg.AdminToken, cfg.EtcdPassword = pass, token, "etcd-secret-Qq1"
	r := start(t, cfg)
	eventually(t, "ready", r.Ready)
	if !r.nc.IsConnected() || ns.NumClients() == 0 {
		t.Fatal("router not connected to the authenticated NATS")
	}
	out := logs.String()
	if !strings.Contains(out, `"msg":"kvroute config"`) || !strings.Contains(out, `"nats_password":"[redacted]"`) ||
		!strings.Contains(out, `"admin_token":"[redacted]"`) || !strings.Contains(out, `"nats_user":"kvroute"`) {
		t.Errorf("config log line missing or not redacted:\n%s", out)
	}
	for _, secret := range []string{pass, token, "etcd-secret-Qq1"} {
		if strings.Contains(out, secret) {
			t.Errorf("a log line holds the secret %q", secret)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://u:p@h:4222":                  "nats://[redacted]@h:4222",
		"nats://a:b@h1:1,nats://c@h2:2":      "nats://[redacted]@h1:1,nats://[redacted]@h2:2",
		"nats://h:4222":                      "nats://h:4222",
		"https://user:pw@etcd.example:2379/": "https://[redacted]@etcd.example:2379/",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
