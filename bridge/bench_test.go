package bridge

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/nats-io/nats.go"
)

// BenchmarkForwardZMQToNATS measures batches per second through the whole
// event path: vllmzmq.Publisher → TCP → Subscriber → stream (decode dp rank,
// sequence) → NATS publish → a NATS subscriber. Each batch is one BlockStored
// of 4 blocks of 16 tokens, a typical prefill step.
func BenchmarkForwardZMQToNATS(b *testing.B) {
	srv := testenv.StartNATS(b)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var got atomic.Int64
	sub, err := nc.Subscribe(bus.EventsWildcard("bench"), func(*nats.Msg) { got.Add(1) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	eng := newFakeEngine(b, "vllm_metrics.txt")
	es := newEngineSide(b, 1, 0)
	ev, rep := es.endpoints()
	cfg := Config{
		Namespace: "bench", WorkerID: "w0", EngineURL: eng.URL,
		EventsEndpoint: ev, ReplayEndpoint: rep, NATS: nc, Logger: quiet(),
	}
	br, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- br.Run(ctx) }()
	defer func() { cancel(); <-done }()

	payload := storedBatch(b, 0, seqTokens(1, 64), 16, nil, 1)
	// Join: publish until the bridge forwards.
	for got.Load() == 0 {
		if _, err := es.pubs[0].Publish(payload); err != nil {
			b.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	base := got.Load()
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := es.pubs[0].Publish(payload); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for got.Load() < base+int64(b.N) {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d batches arrived", got.Load()-base, b.N)
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "batches/s")
	if s := br.Stats().Snapshot(); s.HealFailures != 0 {
		b.Logf("stats: %+v", s)
	}
}
