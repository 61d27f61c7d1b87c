package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/engine/vllmzmq"
)

func TestTopicMatches(t *testing.T) {
	for _, tc := range []struct {
		topic, address string
		match, named   bool
	}{
		{"kv@10.0.0.5@m", "10.0.0.5:8000", true, true},
		{"kv@10.0.0.5:8000@m", "10.0.0.5:8000", true, true},
		{"kv@10.0.0.5:8001@m", "10.0.0.5:8000", false, true},
		{"kv@10.0.0.6@m", "10.0.0.5:8000", false, true},
		{"", "10.0.0.5:8000", false, false},
		{"kv-events", "10.0.0.5:8000", false, false},
	} {
		match, named := TopicMatches(tc.topic, tc.address)
		if match != tc.match || named != tc.named {
			t.Errorf("TopicMatches(%q, %q) = %v, %v; want %v, %v", tc.topic, tc.address, match, named, tc.match, tc.named)
		}
	}
}

func TestBridgeListensForItsEngine(t *testing.T) {
	in := startInfra(t)
	ns := "listen"
	tap := tapEvents(t, in.nc, ns)
	eng := newFakeEngine(t, "vllm_metrics.txt")
	port := freePorts(t, 1)
	listen := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	cfg := Config{
		Namespace: ns, WorkerID: "w0", Engine: engine.EngineVLLM, EngineURL: eng.URL,
		EventsListen: listen, Address: "10.0.0.5:8000", NATS: in.nc,
		ScrapeInterval: 50 * time.Millisecond, SettleDelay: -1,
	}
	b, _ := runBridge(t, cfg)
	// The engine connects its PUB to the bridge (vLLM in llm-d's layout),
	// with no replay socket; a second engine connects by mistake.
	own, err := vllmzmq.NewPublisher(context.Background(), vllmzmq.PublisherConfig{
		Endpoint: listen, Topic: "kv@10.0.0.5@m", Mode: vllmzmq.Connect, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	other, err := vllmzmq.NewPublisher(context.Background(), vllmzmq.PublisherConfig{
		Endpoint: listen, Topic: "kv@10.0.0.9@m", Mode: vllmzmq.Connect, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	waitFor(t, "the other engine's batches to be dropped", 10*time.Second, func() bool {
		_, _ = other.Publish(storedBatch(t, 0, seqTokens(5000, 16), 16, nil, 9))
		return b.Stats().UnknownPublisher.Load() > 0
	})
	sent := connect(t, own, tap, 0)
	msgs := tap.snapshot()
	if !isClear(msgs[0]) {
		t.Fatal("the first message is not AllBlocksCleared")
	}
	if indexOf(msgs, sent[len(sent)-1]) < 0 {
		t.Fatal("the engine's batch was not forwarded")
	}
	for _, m := range msgs {
		if m.Subject != "kvroute."+ns+".events.w0" {
			t.Errorf("message on %q", m.Subject)
		}
	}
	assertGapFree(t, msgs)
}
