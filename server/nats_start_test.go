package server

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/nats-io/nats.go"
)

// A router started while NATS is away serves degraded, connects when NATS
// appears, takes load reports from then on, and marks the workers stale so
// they resync the KV events it never saw.
func TestNATSArrivingAfterTheStartIsJoined(t *testing.T) {
	n := testenv.StartNATS(t)
	n.Stop()
	cfg := testConfig(t)
	cfg.WorkersFile, cfg.NATSURL = workersFile(t, 2), n.URL
	var logs testenv.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	eventually(t, "ready without NATS", r.Ready)
	if got := r.Degraded(); !slices.Equal(got, []string{"nats"}) {
		t.Fatalf("Degraded() = %v, want [nats]", got)
	}
	if !strings.Contains(logs.String(), `msg="dependency degraded" component=nats`) {
		t.Errorf("no degraded line for nats in\n%s", logs.String())
	}

	n.Resume(t)
	eventually(t, "NATS connected", func() bool { return len(r.Degraded()) == 0 })
	eventually(t, "both workers stale until they resync", func() bool {
		st := r.Index().Stats()
		return len(st.PerWorker) == 2 && st.PerWorker[0].Stale && st.PerWorker[1].Stale
	})
	if !strings.Contains(logs.String(), `msg="dependency recovered" component=nats`) {
		t.Errorf("no recovery line for nats in\n%s", logs.String())
	}
	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pool := r.sched.Load().Pool()
	eventually(t, "a load report applied", func() bool {
		_ = nc.Publish(bus.LoadSubject(cfg.Namespace, "w0"), []byte(`{"ts_ms":1,"waiting":7,"running":1,"kv_used_blocks":1,"kv_total_blocks":4096}`))
		l, ok := pool.Load("w0")
		return ok && l.ReportFresh && l.Waiting() == 7
	})
}

// --durable-events recovers the index from the stream before it serves;
// with NATS away at start it refuses, saying so, rather than serve what it
// promised not to.
func TestDurableEventsRefuseToStartWithoutNATS(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile, cfg.NATSURL = workersFile(t, 1), "nats://127.0.0.1:1"
	cfg.Recovery.DurableEvents = true
	r, err := Start(t.Context(), cfg)
	if err == nil {
		_ = r.Shutdown()
		t.Fatal("started with --durable-events and no NATS")
	}
	if !strings.Contains(err.Error(), "--durable-events") || !strings.Contains(err.Error(), "must be reachable at start") {
		t.Fatalf("err = %v, want it to give the reason", err)
	}
}
