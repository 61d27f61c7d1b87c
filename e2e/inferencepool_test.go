//go:build kubeapiserver

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/kubetest"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// poolPorts picks the pods' shared ports: HTTP (the pool's target port), ZMQ
// events and replay. Every "pod" binds them on its own loopback address
// (127.0.0.1 to 127.0.0.4), as real pods bind the same ports on their own
// IPs.
func indexedWorkers(r *server.Server) int { return r.Index().Stats().Workers }

// direct posts a chat body straight to one worker, bypassing the router.
func direct(t *testing.T, w *sim.Worker, body []byte) {
	t.Helper()
	resp, err := http.Post(w.URL()+bench.PathChat, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("direct request: status %d", resp.StatusCode)
	}
}

// sendVia posts a chat body through the gateway.
func sendVia(t *testing.T, c *bench.Client, body []byte) bench.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	r := c.Do(ctx, &bench.Item{Path: bench.PathChat, Body: body, OutputLen: 8})
	if r.Err != nil {
		t.Fatalf("request through the gateway: %v", r.Err)
	}
	return r
}

func poolPorts(t *testing.T, pods int) (httpPort, events, replay int) {
	t.Helper()
	free := func() int {
		for {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			l.Close()
			ok := true
			for i := 2; i <= pods; i++ {
				l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i, port))
				if err != nil {
					ok = false
					break
				}
				l.Close()
			}
			if ok {
				return port
			}
		}
	}
	return free(), free(), free()
}

// The Kubernetes-native path end to end: a real kube-apiserver holds an
// InferencePool and four kvsim "pods" (pod IPs 127.0.0.1-4, all serving on
// the pool's one target port and publishing vLLM ZMQ events on the same
// ports); kvroute runs with --pool-name, --engine-events zmq and
// --engine-load scrape, with no NATS and no etcd for discovery; clients go
// through a real Envoy running the original-dst bootstrap.
func TestKubeAPIServerInferencePoolEndToEnd(t *testing.T) {
	testenv.Quiet()
	const pods = 4
	c := kubetest.Start(t, "llm")
	httpPort, eventsPort, replayPort := poolPorts(t, pods)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	enc, err := sim.LoadChatEncoder(qwenDir, "")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "vllm"}
	c.ApplyPool(t, "vllm", labels, httpPort)
	workers := map[string]*sim.Worker{}
	var routes []envoy.Worker
	for i := range pods {
		id, ip := fmt.Sprintf("kvsim-%d", i), fmt.Sprintf("127.0.0.%d", i+1)
		w, err := sim.StartWorker(ctx, sim.WorkerConfig{
			ID: id, Model: model, Speedup: 50, Encoder: enc,
			Engine:      sim.EngineConfig{NumGPUBlocks: 4096, BlockSize: 16},
			ListenAddr:  net.JoinHostPort(ip, fmt.Sprint(httpPort)),
			ZMQEndpoint: fmt.Sprintf("tcp://%s:%d", ip, eventsPort), ZMQReplayEndpoint: fmt.Sprintf("tcp://%s:%d", ip, replayPort),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		workers[id] = w
		routes = append(routes, envoy.Worker{Cluster: id, Address: w.Addr()})
		c.CreatePod(t, id, labels, nil, ip)
	}

	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.PoolName, cfg.PoolNamespace, cfg.Kubeconfig = "vllm", c.NS, c.API.Kubeconfig
	cfg.PoolDefaults = kubepool.Defaults{Model: model, BlockSize: 16}
	cfg.EngineEvents, cfg.EngineEventsPort, cfg.EngineReplayPort = server.EngineEventsZMQ, eventsPort, replayPort
	cfg.EngineLoad = server.EngineLoadScrape
	cfg.Fallbacks = 0 // the original-dst bootstrap reads one ip:port
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Tokenizers = map[string]tokenizer.ModelSource{model: {Dir: qwenDir}}
	router, err := server.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = router.Wait() })
	if router.NATSURL() != "" {
		t.Fatalf("router connected to NATS %s; the pool path runs without", router.NATSURL())
	}
	eventually(t, "the router to discover the pool's four pods", func() bool { return router.Ready() && indexedWorkers(router) == pods })
	gw, err := bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleOriginalDst, Workers: routes, ExtProcAddr: router.GRPCAddr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	client := bench.NewClient(gw.URL())
	t.Cleanup(client.Close)

	t.Run("prefix-cache routing", func(t *testing.T) {
		w, err := bench.ChatWorkload(bench.ChatOptions{Model: model, Sessions: 16, Turns: 4, SystemPrompts: 4, SystemWords: 300,
			// The think time leaves the ZMQ events of a turn time to reach the
			// index before the next turn on a loaded machine (beside four
			// CPU-bound loops, 50 ms gave overlap_exact under 0.95).
			UserWords: 30, ReplyWords: 30, OutputTokens: 16, Think: 250 * time.Millisecond, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer rcancel()
		results, err := bench.Run(rctx, client, w, bench.RunOptions{Arrival: bench.Arrival{Kind: bench.ArrivalConcurrency, Concurrency: 8}})
		if err != nil {
			t.Fatal(err)
		}
		m := bench.Measure(results, 0)
		if m.Errors != 0 {
			t.Fatalf("%d errors (first: %s)", m.Errors, m.FirstError)
		}
		// A turn whose prefix is already computed and indexed (a follow-up)
		// must be predicted exactly. A first turn that joins a prompt
		// another session is still computing on that worker (the pending
		// overlay and the duplicate-prefill cost send it there) finds
		// however much of it the engine has finished: not predictable.
		exact, predicted := 0, 0
		for _, r := range results {
			if r.Err != nil || r.Follows == nil || r.PredictedCached == nil {
				continue
			}
			predicted++
			if *r.PredictedCached == r.CachedTokens {
				exact++
			}
		}
		if predicted == 0 || float64(exact) < 0.95*float64(predicted) {
			t.Fatalf("overlap_exact on follow-ups %d of %d, want >= 95 %%", exact, predicted)
		}
		t.Logf("overlap_exact on follow-ups %d of %d; over every request %.3f; hit rate %.2f", exact, predicted, *m.OverlapExact, m.HitRate)
	})

	t.Run("a ZMQ gap is repaired by replay", func(t *testing.T) {
		w := workers["kvsim-1"]
		heals := router.EngineFeeds().Stats()
		before := heals.Heals.Load()
		w.DropNextZMQBatches(1)
		direct(t, w, chat(longText("gap", 30), "a question whose blocks travel in the dropped batch"))
		// The gap shows with the engine's next batch; keep it busy until
		// one comes.
		deadline := time.Now().Add(waitLong)
		for i := 0; heals.Heals.Load() <= before; i++ {
			if time.Now().After(deadline) {
				t.Fatalf("no gap healed by replay after %v; engine event counters %+v", waitLong, heals.Snapshot())
			}
			direct(t, w, chat(longText(fmt.Sprintf("after the gap %d", i), 10), "the next batch reveals the gap"))
		}
		if f := heals.HealFailures.Load(); f != 0 {
			t.Fatalf("%d gaps could not be replayed", f)
		}
		// The dropped batch's blocks are in the index: the conversation's
		// next turn routes to kvsim-1 and finds its prefix cached.
		got := sendVia(t, client, chat(longText("gap", 30), "a question whose blocks travel in the dropped batch", "ok", "and a follow-up"))
		if got.Worker != "kvsim-1" || got.CachedTokens == 0 {
			t.Fatalf("follow-up went to %s with %d cached tokens, want kvsim-1 with the replayed prefix", got.Worker, got.CachedTokens)
		}
	})

	t.Run("pod deletion purges the worker", func(t *testing.T) {
		start := time.Now()
		if err := c.Kube.CoreV1().Pods(c.NS).Delete(context.Background(), "kvsim-3", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "kvsim-3 purged from the index", func() bool { return indexedWorkers(router) == pods-1 })
		took := time.Since(start)
		t.Logf("pod deletion to purge: %v", took.Round(time.Millisecond))
		if took > time.Second {
			t.Errorf("purge took %v, want within 1 s", took)
		}
		for range 8 {
			if got := sendVia(t, client, chat(longText(fmt.Sprint(time.Now().UnixNano()), 5), "hi")); got.Worker == "kvsim-3" {
				t.Fatal("a request went to the deleted pod")
			}
		}
	})
}
