package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/picker"
)

// routerConfig is the file the router starts from; mode and weightA are
// what the test reloads.
func routerConfig(natsURL string, etcd []string, grpcPort, httpPort, adminPort int, mode string, weightA float64) string {
	return fmt.Sprintf(`server:
  grpc-addr: 127.0.0.1:%d
  http-addr: 127.0.0.1:%d
  admin-listen: 127.0.0.1:%d
routing:
  mode: %s
  cost:
    model: weighted
    params:
      weighted-a: %g
discovery:
  etcd-endpoints: %s
  state-dir: "off"
events:
  nats-url: %s
requests:
  tokenizer: [%s=%s]
limits:
  shutdown-grace: 2s
  shutdown-drain-delay: 0s
observability:
  log-level: info
  log-format: text
`, grpcPort, httpPort, adminPort, mode, weightA, strings.Join(etcd, ","), natsURL, model, qwenDir)
}

// The kvroute binary started from a configuration file alone reloads a
// change of the router mode (kv → round_robin → kv, by file change and by
// SIGHUP) and of a cost weight under steady traffic through Envoy, with no
// failed request.
func TestConfigFileHotReloadUnderTraffic(t *testing.T) {
	testenv.Quiet()
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvroute")
	build := exec.Command("go", "build", "-o", bin, "../cmd/kvroute")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build kvroute: %v\n%s", err, out)
	}
	n := testenv.StartNATS(t)
	etcd := testenv.StartEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	enc, err := sim.LoadChatEncoder(qwenDir, "")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.StartFleet(ctx, sim.FleetConfig{Workers: 3, NATSURL: n.URL, EtcdEndpoints: etcd.Endpoints,
		Worker: sim.WorkerConfig{Model: model, Engine: sim.EngineConfig{NumGPUBlocks: 4096, BlockSize: 16}, Speedup: 50, LeaseTTL: 10 * time.Second, Encoder: enc}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fleet.Close(context.Background()) }()

	grpcPort, httpPort, adminPort := loopbackPort(t), loopbackPort(t), loopbackPort(t)
	cfgFile := filepath.Join(dir, "kvroute.yaml")
	write := func(mode string, a float64) {
		t.Helper()
		if err := os.WriteFile(cfgFile, []byte(routerConfig(n.URL, etcd.Endpoints, grpcPort, httpPort, adminPort, mode, a)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("kv", 2)
	var logs bytes.Buffer
	var logMu sync.Mutex
	router := exec.Command(bin, "serve", "--config", cfgFile)
	router.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")} // no KVROUTE_* from the caller
	router.Stdout, router.Stderr = lockedWriter{&logMu, &logs}, lockedWriter{&logMu, &logs}
	if err := router.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = router.Process.Signal(syscall.SIGTERM)
		_ = router.Wait()
		if t.Failed() {
			logMu.Lock()
			t.Logf("kvroute log:\n%s", logs.String())
			logMu.Unlock()
		}
	}()
	admin, metricsURL := fmt.Sprintf("http://127.0.0.1:%d", adminPort), fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort)
	eventually(t, "the router sees every worker", func() bool {
		var w bench.DebugWorkers
		return getJSON(admin+"/debug/workers", &w) == nil && len(w.Workers) == 3
	})

	var workers []envoy.Worker
	for _, w := range fleet.Workers() {
		rec := w.Record()
		c := rec.Cluster
		if c == "" {
			c = rec.ID
		}
		workers = append(workers, envoy.Worker{Cluster: c, Address: w.Addr()})
	}
	px, err := bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleClusterHeader, Workers: workers, ExtProcAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = px.Close() }()
	client := bench.NewClient(px.URL())
	defer client.Close()

	// Steady traffic for the whole test: four sessions, each request a
	// longer conversation.
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	tctx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for s := 0; s < 4; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			turns := []string{longText(fmt.Sprintf("session %d", s), 10)}
			for i := 0; tctx.Err() == nil; i++ {
				rctx, cancel := context.WithTimeout(ctx, waitLong)
				r := client.Do(rctx, &bench.Item{Path: bench.PathChat, Body: chat("You are terse.", turns...), OutputLen: 8})
				cancel()
				sent.Add(1)
				if r.Err != nil || r.Worker == "" {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("request %d of session %d: err %v, worker %q", i, s, r.Err, r.Worker))
				}
				turns = append(turns, "ok", fmt.Sprintf("question %d", i))
				if len(turns) > 9 {
					turns = turns[:1]
				}
			}
		}(s)
	}
	modeIs := func(want string) func() bool {
		return func() bool {
			var m struct{ Mode string }
			return getJSON(admin+"/admin/mode", &m) == nil && m.Mode == want
		}
	}
	applied := func() float64 { return scrape(metricsURL, `kvroute_config_reloads_total{outcome="applied"}`) }
	probe := chat("You are terse.", longText("probe", 10))

	time.Sleep(500 * time.Millisecond)
	write("round_robin", 2) // picked up by the file poll
	eventually(t, "mode round_robin from the file", modeIs("round_robin"))
	time.Sleep(500 * time.Millisecond)

	write("kv", 5) // a cost weight too; SIGHUP rather than waiting for the poll
	if err := router.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "mode kv again", modeIs("kv"))
	eventually(t, "weighted-a 5 in /debug/explain", func() bool {
		x, err := explainAt(admin, probe)
		return err == nil && x.Decision != nil && x.Decision.Coefficients != nil && x.Decision.Coefficients.A == 5
	})
	time.Sleep(500 * time.Millisecond)

	// A bad file is refused and the configuration in use kept.
	if err := os.WriteFile(cfgFile, []byte("routing:\n  mode: magic\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bad file rejected", func() bool {
		return scrape(metricsURL, `kvroute_config_reloads_total{outcome="rejected"}`) >= 1
	})
	stopTraffic()
	wg.Wait()

	if !modeIs("kv")() {
		t.Error("a rejected file changed the mode")
	}
	if got := applied(); got < 2 {
		t.Errorf("kvroute_config_reloads_total{outcome=\"applied\"} = %g, want at least 2", got)
	}
	if f := failed.Load(); f > 0 || sent.Load() < 20 {
		t.Errorf("%d of %d requests failed (first: %v); want none of at least 20", f, sent.Load(), firstErr.Load())
	}
	t.Logf("%d requests through two reloads and a refused file, %d failed", sent.Load(), failed.Load())
}

// loopbackPort is a free loopback TCP port for the router to listen on.
func loopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func explainAt(admin string, body []byte) (picker.Explanation, error) {
	var x picker.Explanation
	resp, err := http.Post(admin+"/debug/explain?path="+bench.PathChat, "application/json", bytes.NewReader(body))
	if err != nil {
		return x, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return x, fmt.Errorf("/debug/explain: %s", resp.Status)
	}
	return x, json.NewDecoder(resp.Body).Decode(&x)
}

// scrape returns the value of one exact sample line prefix in /metrics.
func scrape(url, sample string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, sample+" ") {
			var v float64
			_, _ = fmt.Sscan(strings.TrimPrefix(line, sample+" "), &v)
			return v
		}
	}
	return 0
}
