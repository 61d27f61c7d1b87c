//go:build compare && kubeapiserver

// Package compare runs kvroute beside its peers, each as its users run it.
// This file: the Gateway API Inference Extension's endpoint picker (EPP)
// against kvroute's --pool-name mode, one picker at a time, on the same
// InferencePool in a real kube-apiserver, the same simulated vLLM pods, the
// same real Envoy (original-dst bootstrap: the Gateway API data plane's
// ext_proc contract) and the same client and workload.
//
// Run by `make compare`; by hand:
//
//	KVROUTE_GIE_EPP=... KVROUTE_GIE_CRDS=... KVROUTE_KUBE_APISERVER=... KVROUTE_ENVOY=... \
//	  go test -tags 'compare kubeapiserver' -run TestGIE -v -timeout 30m ./peers/compare -args -out DIR
package compare

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/envoy/proxy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/kubetest"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	outDir      = flag.String("out", "", "directory for gie.md and gie.json")
	concurrency = flag.String("concurrency", "16,40", "concurrent sessions, comma-separated")
	repeats     = flag.Int("repeats", 1, "runs per picker and concurrency (fresh workers and picker each)")
	dupWeight   = flag.Float64("duplicate-prefill-weight", -1, "kvroute's --duplicate-prefill-weight (-1: its default)")
	only        = flag.String("only", "", "run only the pickers whose name contains this")
)

const (
	model    = bench.DefaultModel
	qwenDir  = "../../tokenizer/testdata/qwen3"
	pods     = 4
	gieGroup = "inference.networking.k8s.io"
)

// The two GIE configurations: the chart's shipped default (queue,
// KV-cache utilization and prefix-cache scorers at weight 1), and the EPP
// configuration guide's example (the prefix-cache scorer at weight 50).
const (
	gieDefault = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: prefix-cache-scorer
`
	gieDocs = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 5
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 50
`
)

// picker is one endpoint picker under test.
type picker struct {
	name string
	// start brings the picker up for the pool and returns its ext_proc
	// address and a function that reads its mean decision time (ms).
	start func(t *testing.T, ctx context.Context, c *kubetest.Cluster, pool string, ports poolPorts) (addr string, decisionMs func() float64)
}

// row is one run's figures.
type row struct {
	Picker       string  `json:"picker"`
	Sessions     int     `json:"concurrent_sessions"`
	Requests     int     `json:"requests"`
	Errors       int     `json:"errors"`
	HitRate      float64 `json:"hit_rate"`
	FirstTurnHit float64 `json:"first_turn_hit_rate"`
	FollowUpHit  float64 `json:"follow_up_hit_rate"`
	Stickiness   float64 `json:"follow_ups_on_previous_worker"`
	TTFTP50      float64 `json:"ttft_p50_ms"`
	TTFTP90      float64 `json:"ttft_p90_ms"`
	TTFTP99      float64 `json:"ttft_p99_ms"`
	DecisionMs   float64 `json:"decision_mean_ms"`
	IdealHit     float64 `json:"ideal_hit_rate"`
}

func TestGIEAgainstKvroute(t *testing.T) {
	testenv.Quiet()
	epp := os.Getenv("KVROUTE_GIE_EPP")
	crdDir := os.Getenv("KVROUTE_GIE_CRDS")
	if epp == "" || crdDir == "" {
		t.Fatal("KVROUTE_GIE_EPP (the built cmd/epp) and KVROUTE_GIE_CRDS (its config/crd/bases) must be set; make compare sets them")
	}
	if _, err := proxy.Find(); err != nil {
		t.Fatal(err)
	}
	var crds [][]byte
	files, _ := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crds = append(crds, b)
	}
	if len(crds) == 0 {
		t.Fatalf("no CRDs in %s", crdDir)
	}
	c := kubetest.StartWithCRDs(t, "compare", crds...)
	pickers := []picker{
		{"GIE EPP v1.0.0, shipped default scorers", gieStart(epp, gieDefault)},
		{"GIE EPP v1.0.0, prefix-cache scorer weight 50 (its docs' example)", gieStart(epp, gieDocs)},
		{"kvroute --pool-name", kvrouteStart},
	}
	var rows []row
	run := 0
	for _, cs := range strings.Split(*concurrency, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(cs))
		if err != nil || n <= 0 {
			t.Fatalf("-concurrency %q", cs)
		}
		for range *repeats {
			for _, p := range pickers {
				if !strings.Contains(p.name, *only) {
					continue
				}
				run++
				r := runOne(t, c, fmt.Sprintf("run%d", run), p, n)
				t.Logf("%+v", r)
				rows = append(rows, r)
			}
		}
	}
	if *outDir != "" {
		writeReport(t, *outDir, rows)
	}
}

// poolPorts are the pods' shared ports on their own loopback addresses.
type poolPorts struct{ http, events, replay int }

func freePorts(t *testing.T) poolPorts {
	t.Helper()
	var ps []int
	for len(ps) < 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ok := true
		for i := 2; i <= pods; i++ { // free on every pod's address too
			l2, err := net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.0.0.%d", i), strconv.Itoa(p)))
			if err != nil {
				ok = false
				break
			}
			l2.Close()
		}
		if ok {
			ps = append(ps, p)
		}
	}
	return poolPorts{ps[0], ps[1], ps[2]}
}

// runOne starts fresh workers (pods) in a fresh namespace, the picker and
// Envoy, replays the workload and measures it.
func runOne(t *testing.T, base *kubetest.Cluster, ns string, p picker, sessions int) row {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := base.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := *base
	c.NS = ns
	ports := freePorts(t)
	enc, err := sim.LoadChatEncoder(qwenDir, "")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "vllm-" + ns}
	c.ApplyPool(t, "vllm", labels, ports.http)
	var workers []*sim.Worker
	for i := range pods {
		id, ip := fmt.Sprintf("%s-pod-%d", ns, i), fmt.Sprintf("127.0.0.%d", i+1)
		w, err := sim.StartWorker(ctx, sim.WorkerConfig{
			ID: id, Model: model, Encoder: enc, Speedup: 1,
			Engine:      sim.EngineConfig{NumGPUBlocks: 4096, BlockSize: 16},
			ListenAddr:  net.JoinHostPort(ip, strconv.Itoa(ports.http)),
			ZMQEndpoint: fmt.Sprintf("tcp://%s:%d", ip, ports.events), ZMQReplayEndpoint: fmt.Sprintf("tcp://%s:%d", ip, ports.replay),
		})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
		c.CreatePod(t, id, labels, nil, ip)
	}
	defer func() {
		for _, w := range workers {
			_ = w.Close(context.Background())
		}
	}()
	addr, decision := p.start(t, ctx, &c, "vllm", ports)
	gw, err := bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleOriginalDst, ExtProcAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	client := bench.NewClient(gw.URL())
	defer client.Close()
	waitServing(t, ctx, client)
	for _, w := range workers {
		w.ResetCache() // the probe's blocks
	}
	time.Sleep(500 * time.Millisecond)

	wl, err := bench.ChatWorkload(bench.ChatOptions{Model: model, Sessions: 40, Turns: 4, SystemPrompts: 6, SystemWords: 1400,
		UserWords: 30, ReplyWords: 30, OutputTokens: 16, Think: 250 * time.Millisecond, Seed: 7, Encode: enc.EncodeChat})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer rcancel()
	start := time.Now()
	results, err := bench.Run(rctx, client, wl, bench.RunOptions{Arrival: bench.Arrival{Kind: bench.ArrivalConcurrency, Concurrency: sessions}})
	if err != nil {
		t.Fatal(err)
	}
	m := bench.Measure(results, time.Since(start))
	r := row{Picker: p.name, Sessions: sessions, Requests: m.Requests, Errors: m.Errors, HitRate: m.HitRate,
		TTFTP50: m.TTFT.P50, TTFTP90: m.TTFT.P90, TTFTP99: m.TTFT.P99, DecisionMs: decision()}
	if ideal, ok := bench.IdealHitRates(wl, 16, pods*4096); ok {
		r.IdealHit = ideal.Infinite
	}
	r.FirstTurnHit, r.FollowUpHit, r.Stickiness = splitTurns(results)
	return r
}

// splitTurns gives the hit rate of first turns and of follow-ups, and the
// share of follow-ups served by the worker that served the turn before.
func splitTurns(results []bench.Result) (first, follow, sticky float64) {
	worker := map[bench.ItemRef]string{}
	for _, r := range results {
		if r.Err == nil {
			worker[r.Ref] = r.Worker
		}
	}
	var fc, fp, oc, op, same, n int
	for _, r := range results {
		if r.Err != nil {
			continue
		}
		if r.Follows == nil {
			fc += r.CachedTokens
			fp += r.PromptTokens
			continue
		}
		oc += r.CachedTokens
		op += r.PromptTokens
		n++
		if worker[*r.Follows] == r.Worker {
			same++
		}
	}
	return ratio(fc, fp), ratio(oc, op), ratio(same, n)
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// waitServing sends a probe until the data plane answers with a worker.
func waitServing(t *testing.T, ctx context.Context, c *bench.Client) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 1, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": "probe"}}})
	for {
		r := c.Do(ctx, &bench.Item{Path: bench.PathChat, Body: body, OutputLen: 1})
		if r.Err == nil && r.Worker != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the picker never routed a probe: %v", r.Err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// gieStart runs GIE's EPP binary with its documented flags for a
// plaintext data plane and vLLM's metric names.
func gieStart(bin, config string) func(*testing.T, context.Context, *kubetest.Cluster, string, poolPorts) (string, func() float64) {
	return func(t *testing.T, ctx context.Context, c *kubetest.Cluster, pool string, _ poolPorts) (string, func() float64) {
		t.Helper()
		grpc, health, metrics := freeLocal(t), freeLocal(t), freeLocal(t)
		cmd := exec.CommandContext(ctx, bin,
			"--pool-name", pool, "--pool-namespace", c.NS, "--pool-group", gieGroup,
			"--grpc-port", strconv.Itoa(grpc), "--grpc-health-port", strconv.Itoa(health), "--metrics-port", strconv.Itoa(metrics),
			"--secure-serving=false", "--config-text", config,
			"--kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc", "--lora-info-metric", "",
			"--enable-pprof=false", "--v", "1")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+c.API.Kubeconfig)
		logf, err := os.CreateTemp("", "gie-epp-*.log")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); logf.Close(); os.Remove(logf.Name()) })
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(grpc))
		deadline := time.Now().Add(60 * time.Second)
		for {
			if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(logf.Name())
				t.Fatalf("GIE EPP not listening on %s after 60 s:\n%s", addr, tail(b))
			}
			time.Sleep(200 * time.Millisecond)
		}
		// The EPP's metrics sit behind Kubernetes authentication and
		// authorization: the cluster admin's token passes both.
		url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)
		return addr, func() float64 {
			return histMeanMsLabel(url, c.API.Token, "inference_extension_scheduler_e2e_duration_seconds", "")
		}
	}
}

// kvrouteStart runs kvroute in-process in --pool-name mode, as the
// InferencePool e2e test does: engine events over ZMQ, load scraped.
func kvrouteStart(t *testing.T, ctx context.Context, c *kubetest.Cluster, pool string, ports poolPorts) (string, func() float64) {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.PoolName, cfg.PoolNamespace, cfg.Kubeconfig = pool, c.NS, c.API.Kubeconfig
	cfg.PoolDefaults = kubepool.Defaults{Model: model, BlockSize: 16}
	cfg.EngineEvents, cfg.EngineEventsPort, cfg.EngineReplayPort = server.EngineEventsZMQ, ports.events, ports.replay
	cfg.EngineLoad = server.EngineLoadScrape
	cfg.Fallbacks = 0 // ORIGINAL_DST reads one ip:port
	cfg.ShutdownGrace = time.Second
	cfg.Tokenizers = map[string]tokenizer.ModelSource{model: {Dir: qwenDir}}
	if *dupWeight >= 0 {
		cfg.Scoring.DuplicatePrefillWeight = *dupWeight
	}
	rctx, cancel := context.WithCancel(ctx)
	r, err := server.Start(rctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = r.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for !r.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("kvroute not ready after 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	url := "http://" + r.HTTPAddr() + "/metrics"
	return r.GRPCAddr(), func() float64 {
		var sum float64
		for _, ph := range []string{"parse", "tokenize", "match", "pick"} {
			sum += histMeanMsLabel(url, "", "kvroute_decision_duration_seconds", `phase="`+ph+`"`)
		}
		return sum
	}
}

func freeLocal(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// histMeanMsLabel reads a Prometheus histogram's _sum / _count (over the
// series that contain label) and returns the mean in milliseconds; a
// token, when set, is sent as a bearer token.
func histMeanMsLabel(url, token, name, label string) float64 {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var sum, count float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		line := sc.Text()
		if label != "" && !strings.Contains(line, label) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, name+"_sum"):
			sum += v
		case strings.HasPrefix(line, name+"_count"):
			count += v
		}
	}
	if count == 0 {
		return 0
	}
	return 1000 * sum / count
}

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func writeReport(t *testing.T, dir string, rows []row) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(rows, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "gie.json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "## The Gateway API's endpoint picker, on the same InferencePool\n\n")
	fmt.Fprintf(&md, "A real kube-apiserver with GIE v1.0.0's own CRDs, %d simulated vLLM pods (kvsim, 16-token blocks, 4,096 blocks each) on 127.0.0.1–%d, "+
		"the same real Envoy (original-dst bootstrap, FULL_DUPLEX_STREAMED) in front of one picker at a time, fresh pods and picker per run; "+
		"40 sessions × 4 turns over 6 shared system prompts (about 1.9k tokens), 16 output tokens, 250 ms think time. "+
		"Hit rate is Σ cached ÷ Σ prompt tokens as the workers report them. Decision time is each picker's own histogram mean "+
		"(GIE: scheduler_e2e_duration_seconds; kvroute: parse + tokenize + match + pick), different scopes.\n\n", pods, pods)
	md.WriteString("| picker | concurrent sessions | hit rate (ideal) | first turns | follow-ups | follow-ups on the previous worker | TTFT p50 / p90 / p99 ms | errors | decision ms |\n|---|---|---|---|---|---|---|---|---|\n")
	slices.SortStableFunc(rows, func(a, b row) int { return a.Sessions - b.Sessions })
	for _, r := range rows {
		fmt.Fprintf(&md, "| %s | %d | %.3f (%.3f) | %.3f | %.3f | %.0f %% | %.0f / %.0f / %.0f | %d | %.3f |\n",
			r.Picker, r.Sessions, r.HitRate, r.IdealHit, r.FirstTurnHit, r.FollowUpHit, 100*r.Stickiness, r.TTFTP50, r.TTFTP90, r.TTFTP99, r.Errors, r.DecisionMs)
	}
	if err := os.WriteFile(filepath.Join(dir, "gie.md"), []byte(md.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
