// Package e2e holds kvroute's end-to-end tests: embedded NATS and etcd,
// simulated vLLM workers and a kvroute router run in the test process, and
// a real Envoy (package envoy/proxy) runs the bootstraps kvroute generates in
// front of them; everything talks over loopback exactly as it would in a
// deployment.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/server"
)

const (
	model    = bench.DefaultModel
	qwenDir  = "../tokenizer/testdata/qwen3"
	waitLong = 60 * time.Second
)

// system is one running stack plus the servers it uses.
type system struct {
	*bench.Env
	NATS   *testenv.NATS
	client *bench.Client
}

// options tweak the stack a test starts.
type options struct {
	workers  int
	style    string
	leaseTTL time.Duration
	mode     string
	// mmFamily and chatTemplate serve a vision-language model (see
	// multimodal_test.go).
	mmFamily, chatTemplate string
	// jetstream enables JetStream on the NATS server; router edits the
	// router's configuration (see durable_test.go).
	jetstream bool
	router    func(*server.Config)
	// envoyTLS makes Envoy dial the router over TLS (see envoy_test.go).
	envoyTLS *envoy.TLSFiles
	// speedup divides the workers' simulated step times (default 50).
	speedup float64
	// responsePath is envoy.Options.ResponsePath.
	responsePath string
}

// start brings up NATS, etcd, workers, kvroute and the gateway, all torn
// down when t ends. Workers use 16-token blocks (vLLM's default) and the
// Qwen3 tokenizer, so chat requests are tokenized by router and workers
// alike; simulated time runs 50× faster.
func start(t *testing.T, o options) *system {
	t.Helper()
	testenv.Quiet()
	if o.workers == 0 {
		o.workers = 4
	}
	if o.speedup == 0 {
		o.speedup = 50
	}
	nats := testenv.StartNATS
	if o.jetstream {
		nats = testenv.StartJetStream
	}
	n := nats(t)
	etcd := testenv.StartEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	env, err := bench.StartEnv(ctx, bench.EnvConfig{
		NATSURL: n.URL, EtcdEndpoints: etcd.Endpoints, Workers: o.workers, Model: model,
		Engine:  sim.EngineConfig{NumGPUBlocks: 4096, BlockSize: 16},
		Speedup: o.speedup, LeaseTTL: o.leaseTTL, TokenizerDir: qwenDir, Mode: o.mode, Style: o.style,
		MMFamily: o.mmFamily, ChatTemplate: o.chatTemplate, Router: o.router, EnvoyTLS: o.envoyTLS, ResponsePath: o.responsePath,
		// ORIGINAL_DST parses x-gateway-destination-endpoint as a single
		// ip:port, so the original-dst bootstrap cannot take kvroute's
		// default fallback list ("ip:port,ip:port"): see the kvbench report.
		NoFallbacks: o.style == envoy.StyleOriginalDst,
	})
	if err != nil {
		cancel()
		t.Fatalf("start system: %v", err)
	}
	c := bench.NewClient(env.URL())
	t.Cleanup(func() {
		c.Close()
		env.Close()
		cancel()
	})
	return &system{Env: env, NATS: n, client: c}
}

// chat returns a streaming chat body: a system prompt, then the turns so
// far (user, assistant, user, ...).
func chat(system string, turns ...string) []byte {
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": t})
	}
	b, _ := json.Marshal(map[string]any{
		"model": model, "messages": msgs, "max_tokens": 8, "ignore_eos": true, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	return b
}

// longText is n sentences that differ by seed, long enough to fill many
// 16-token blocks.
func longText(seed string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "Note %d of %s: the cache keeps prefixes warm, so routing matters. ", i, seed)
	}
	return b.String()
}

// send posts a chat body through the gateway and fails the test on error.
func (s *system) send(t *testing.T, body []byte) bench.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	r := s.client.Do(ctx, &bench.Item{Path: bench.PathChat, Body: body, OutputLen: 8})
	if r.Err != nil {
		t.Fatalf("request through the gateway: %v", r.Err)
	}
	if r.Worker == "" {
		t.Fatalf("response names no worker")
	}
	return r
}

// direct posts a body straight to one worker, bypassing the router, so
// only its KV events can tell the router about it.
func (s *system) direct(t *testing.T, worker string, body []byte) {
	t.Helper()
	w := s.Fleet.Worker(worker)
	if w == nil {
		t.Fatalf("no worker %s", worker)
	}
	resp, err := http.Post(w.URL()+bench.PathChat, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("worker %s answered %s", worker, resp.Status)
	}
}

// explain asks the router's /debug/explain what it would do with body.
func (s *system) explain(t *testing.T, body []byte) picker.Explanation {
	t.Helper()
	resp, err := http.Post(s.AdminURL()+"/debug/explain?path="+bench.PathChat, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var x picker.Explanation
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("/debug/explain: %s: %s", resp.Status, msg)
	}
	if err := json.NewDecoder(resp.Body).Decode(&x); err != nil {
		t.Fatalf("/debug/explain: %v", err)
	}
	return x
}

// metric returns the value of the router's Prometheus sample whose line
// starts with name and contains every label pair, or 0 when absent.
func (s *system) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return metricAt(t, s.RouterURL(), name, labels...)
}

// reportsSince counts the workers whose latest load report, as the router
// holds it, was stamped after t0.
func (s *system) reportsSince(t *testing.T, t0 time.Time) int {
	t.Helper()
	var dw struct {
		Workers []struct {
			Load *struct {
				Report struct {
					TSMillis int64 `json:"ts_ms"`
				} `json:"report"`
			} `json:"load"`
		} `json:"workers"`
	}
	if err := getJSON(s.AdminURL()+"/debug/workers?verbose=1", &dw); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, w := range dw.Workers {
		if w.Load != nil && w.Load.Report.TSMillis > t0.UnixMilli() {
			n++
		}
	}
	return n
}

// indexed returns the router index's view of one worker.
func (s *system) indexed(id string) (blocks int, stale, present bool) {
	for _, w := range s.Router.Index().Stats().PerWorker {
		if w.ID == id {
			return w.Blocks, w.Stale, true
		}
	}
	return 0, false, false
}

// eventually polls cond every 20 ms until it holds or waitLong passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLong, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ids lists the fleet's worker ids.
func (s *system) ids() []string {
	var out []string
	for _, w := range s.Fleet.Workers() {
		out = append(out, w.ID())
	}
	return out
}
