package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/scoring"
	"github.com/nats-io/nats.go"
)

// A batch lost on a worker that then goes quiet is noticed from its next
// load report (kv_event_batches), not only when it publishes again.
func TestLostBatchOnAQuietWorkerShowsInItsLoadReport(t *testing.T) {
	ns := testenv.StartNATS(t)
	f, err := StartFleet(context.Background(), FleetConfig{Workers: 1, NATSURL: ns.URL, Worker: WorkerConfig{
		Model: "m", Namespace: "lb", Speedup: 1000, Engine: EngineConfig{NumGPUBlocks: 64, BlockSize: 16}, Logger: quietLogger(),
		LoadInterval: 100 * time.Millisecond,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(context.Background()) })
	w := f.Worker("w0")
	view := newRouterView(t, ns.URL, "lb", "w0")
	pool := scoring.NewPool(scoring.DefaultOptions())
	if err := pool.Upsert(w.Record()); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	reports := bus.NewLoadReports(nc, "lb", pool, pool.Metrics())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := reports.Start(ctx); err != nil {
		t.Fatal(err)
	}
	reports.FollowEvents(view.cons)

	a := seq(0, 70)
	if _, err := w.Generate(context.Background(), a, 1); err != nil {
		t.Fatal(err)
	}
	view.waitFor(t, "A in the router", "w0", a, 64)

	w.DropNextBatches(1)
	if _, err := w.Generate(context.Background(), seq(1000, 70), 1); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the drop", func() bool { return w.Stats().DroppedBatches == 1 })
	dropped := time.Now()
	// The worker publishes nothing more; its reports say what it sent.
	waitUntil(t, "the lost batch seen from a load report", func() bool { _, stale := view.match("w0", a); return stale })
	if took := time.Since(dropped); took > 2*time.Second {
		t.Errorf("the gap took %v to show, want about two report intervals", took)
	}
	if got := view.cons.Stats().Gaps; got != 1 {
		t.Errorf("gaps = %d, want 1", got)
	}
	if st := w.Stats(); st.EventBatches != 1 {
		t.Errorf("the worker sent %d batches after A's, want none (no later batch revealed the gap)", st.EventBatches-1)
	}
}
