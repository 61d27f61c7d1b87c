package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bridge"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const (
	e2eModel = "Qwen/Qwen3-8B"
	qwenDir  = "../../tokenizer/testdata/qwen3"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestEndToEndKvsimZMQThroughBridgeToRouter runs the path a real vLLM fleet
// takes: simulated vLLM workers that publish KV events only over ZMQ (no
// NATS, no etcd of their own), a kvbridge beside each, and a kvroute
// router that learns the fleet from etcd and the caches from NATS. After a
// long prompt runs on one worker, the router sends the same prompt there.
func TestEndToEndKvsimZMQThroughBridgeToRouter(t *testing.T) {
	testenv.Quiet()
	t0 := time.Now()
	defer func() { t.Logf("total %v", time.Since(t0)) }()
	natsSrv := testenv.StartNATS(t)
	etcd := testenv.StartEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	enc, err := sim.LoadChatEncoder(qwenDir, "")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	rcfg := server.DefaultConfig()
	rcfg.GRPCAddr, rcfg.HTTPAddr, rcfg.AdminAddr = "127.0.0.1:0", "-", "-"
	rcfg.NATSURL = natsSrv.URL
	rcfg.EtcdEndpoints = etcd.Endpoints
	rcfg.Tokenizers = map[string]tokenizer.ModelSource{e2eModel: {Dir: qwenDir}}
	rcfg.KVEvents = true
	rcfg.Logger = discard()
	rcfg.ShutdownGrace = time.Second
	r, err := server.Start(ctx, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = r.Wait()
	}()

	t.Logf("router up after %v", time.Since(t0))
	ids := []string{"vllm-a", "vllm-b", "vllm-c"}
	workers := map[string]*sim.Worker{}
	for _, id := range ids {
		w, err := sim.StartWorker(ctx, sim.WorkerConfig{
			ID: id, Model: e2eModel, Encoder: enc, Speedup: 1000,
			Engine:      sim.EngineConfig{NumGPUBlocks: 4096, BlockSize: 16},
			ZMQEndpoint: "tcp://127.0.0.1:0", ZMQReplayEndpoint: "tcp://127.0.0.1:0", ZMQTopic: "kv-events",
			Logger: discard(),
		})
		if err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		defer w.Close(context.Background())
		workers[id] = w
		b, err := bridge.New(bridge.Config{
			Namespace: rcfg.Namespace, WorkerID: id, EngineURL: w.URL(),
			EventsEndpoint: w.ZMQEndpoint(), ReplayEndpoint: w.ZMQReplayEndpoint(), Topic: "kv-events",
			Address: w.Addr(), NATS: nc, Etcd: cli, LeaseTTL: 2 * time.Second,
			ScrapeInterval: 50 * time.Millisecond, SettleDelay: 100 * time.Millisecond, Logger: discard(),
		})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- b.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("bridge %s: %v", id, err)
			}
		}()
	}
	waitUntil(t, "the router to see all three workers", func() bool {
		return r.Ready() && len(r.Index().Stats().PerWorker) == len(ids)
	})

	t.Logf("fleet seen after %v", time.Since(t0))
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":4}`,
		e2eModel, strings.Repeat("A long shared system prompt that is worth caching. ", 40))
	explain := func() *picker.Explanation {
		t.Helper()
		x, err := r.Picker().Explain(&extproc.Request{
			Method: "POST", Path: "/v1/chat/completions", Body: []byte(body), HasBody: true,
			Headers: map[string]string{":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	if x := explain(); x.CachedTokens != 0 {
		t.Fatalf("before any request the router believes %d tokens are cached", x.CachedTokens)
	}
	// Run the prompt on the worker the router would not pick on its own.
	target := "vllm-b"
	if explain().Chosen == target {
		target = "vllm-c"
	}
	resp, err := http.Post(workers[target].URL()+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("worker %s answered %d", target, resp.StatusCode)
	}

	t.Logf("request done after %v", time.Since(t0))
	var x *picker.Explanation
	waitUntil(t, "the router to route the prompt to the worker holding it", func() bool {
		x = explain()
		return x.Chosen == target && x.CachedTokens >= 16*20
	})
	t.Logf("router chose %s with %d of %d prompt tokens cached", x.Chosen, x.CachedTokens, x.PromptTokens)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
