package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/server"
)

// kvroute restarted while etcd is away: it routes on the fleet it kept in
// its state directory, as before the restart, and xDS keeps Envoy's
// workers. A router that knows no worker at all (no state kept) answers
// the way a router that is down does: cluster-header and xds let Envoy
// route (fail open), original-dst fails closed with an OpenAI-style error
// body from Envoy's local-reply config; never a 503 of kvroute's making.
func TestRouterRestartedDuringAnEtcdOutage(t *testing.T) {
	for _, tc := range []struct {
		style string
		open  bool
	}{{envoy.StyleClusterHeader, true}, {envoy.StyleXDS, true}, {envoy.StyleOriginalDst, false}} {
		t.Run(tc.style, func(t *testing.T) {
			testenv.Quiet()
			const workers = 3
			n := testenv.StartNATS(t)
			etcd := testenv.StartEtcd(t)
			stateDir := t.TempDir()
			var rcfg server.Config
			ctx, cancel := context.WithCancel(context.Background())
			env, err := bench.StartEnv(ctx, bench.EnvConfig{
				NATSURL: n.URL, EtcdEndpoints: etcd.Endpoints, Workers: workers, Model: model,
				Engine:  sim.EngineConfig{NumGPUBlocks: 4096, BlockSize: 16},
				Speedup: 50, TokenizerDir: qwenDir, Style: tc.style,
				NoFallbacks: tc.style == envoy.StyleOriginalDst,
				Router:      func(c *server.Config) { c.Recovery.StateDir = stateDir; rcfg = *c },
			})
			if err != nil {
				cancel()
				t.Fatalf("start system: %v", err)
			}
			t.Cleanup(func() { env.Close(); cancel() })
			s := &system{Env: env, NATS: n, client: bench.NewClient(env.URL())}
			t.Cleanup(s.client.Close)

			if r := s.sendWithHeaders(t, chat(longText("before", 4), "q"), nil); r.status != http.StatusOK || r.predicted == "" {
				t.Fatalf("before the outage: status %d, prediction %q; want 200 routed by kvroute", r.status, r.predicted)
			}
			stateFile := filepath.Join(stateDir, "fleet-"+rcfg.Namespace+".json")
			eventually(t, "the state file to hold the fleet", func() bool {
				var st struct{ Workers []json.RawMessage }
				b, err := os.ReadFile(stateFile)
				return err == nil && json.Unmarshal(b, &st) == nil && len(st.Workers) == workers
			})
			if tc.style == envoy.StyleXDS {
				eventually(t, "Envoy to hold every worker", func() bool { return envoyHosts(t, s) == workers })
			}

			etcd.Stop()
			restart := func(dir string) {
				t.Helper()
				old := env.Router
				if err := old.Shutdown(); err != nil {
					t.Fatal(err)
				}
				cfg := rcfg
				cfg.GRPCAddr, cfg.XDSAddr = old.GRPCAddr(), old.XDSAddr()
				cfg.Recovery.StateDir = dir
				r, err := server.Start(ctx, cfg)
				if err != nil {
					t.Fatalf("restart kvroute: %v", err)
				}
				env.Router = r
			}

			// Restarted with its state: ready, and every request routed by
			// kvroute to a worker, as before.
			restart(stateDir)
			eventually(t, "the restarted router to be ready on its kept fleet", env.Router.Ready)
			served := map[string]int{}
			for i := range 6 {
				r := s.sendWithHeaders(t, chat(longText(fmt.Sprintf("kept %d", i), 4), "q"), nil)
				if r.status != http.StatusOK || r.predicted == "" {
					t.Fatalf("request %d after the restart: status %d, prediction %q; want 200 routed by kvroute", i, r.status, r.predicted)
				}
				served[r.worker]++
			}
			if tc.style == envoy.StyleXDS {
				if h := envoyHosts(t, s); h != workers {
					t.Errorf("Envoy holds %d workers after the restart, want %d", h, workers)
				}
			}

			// Restarted with no state: it knows no worker at all.
			restart(t.TempDir())
			ok := 0
			for i := range 6 {
				status, body, predicted := post(t, s.URL()+bench.PathChat, chat(longText(fmt.Sprintf("cold %d", i), 4), "q"))
				if predicted != "" {
					t.Errorf("request %d carries a prediction from a router that knows no worker", i)
				}
				if status == http.StatusOK {
					ok++
					continue
				}
				if tc.open {
					t.Errorf("request %d: status %d %s; want Envoy to route it (fail open)", i, status, body)
					continue
				}
				var e struct {
					Error struct{ Message, Type, Code string }
				}
				if status != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Error.Code != "router_unavailable" || e.Error.Message == "" {
					t.Errorf("request %d: status %d, body %q; want 503 with an OpenAI error body, code router_unavailable", i, status, body)
				}
			}
			if tc.open && ok != 6 {
				t.Errorf("%d of 6 requests served by a router that knows no worker, want 6 (fail open)", ok)
			}
			if !tc.open && ok != 0 {
				t.Errorf("%d of 6 requests served; original-dst must fail closed", ok)
			}
			if tc.style == envoy.StyleXDS {
				if h := envoyHosts(t, s); h != workers {
					t.Errorf("Envoy holds %d workers once a router with no fleet serves xDS, want %d kept", h, workers)
				}
			}
		})
	}
}

// envoyHosts is how many hosts Envoy's xDS worker cluster holds.
func envoyHosts(t *testing.T, s *system) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := s.Envoy.Stat(ctx, "cluster."+envoy.WorkersClusterName+".membership_total")
	if err != nil {
		return -1
	}
	return int(n)
}

// post sends a non-streaming chat through Envoy and returns the status,
// the body and the predicted-cached-tokens header.
func post(t *testing.T, url string, body []byte) (int, []byte, string) {
	t.Helper()
	body = bytes.Replace(body, []byte(`"stream":true`), []byte(`"stream":false`), 1)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Get("x-kvroute-predicted-cached-tokens")
}
