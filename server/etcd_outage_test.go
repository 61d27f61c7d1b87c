package server

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
)

// An etcd outage is logged and shown as degraded, and its end does not
// empty the fleet: the worker whose lease lapsed only because etcd was
// away keeps its place (ready, routable) and its index entries while it
// registers again. Before, etcd's restart removed it at once.
func TestEtcdOutageKeepsTheFleet(t *testing.T) {
	var logs testenv.SyncBuffer
	rig := startFlapRig(t, time.Minute, slog.New(slog.NewTextHandler(&logs, nil)))
	r := rig.r

	var notReady atomic.Int64 // samples with the router not ready
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if !r.Ready() || r.fleet.len() == 0 {
				notReady.Add(1)
			}
		}
	}()
	defer func() { close(stop); <-sampled }()

	rig.etcd.Stop()
	rig.reg.Abandon() // w9's keepalive stops while etcd is away: its lease lapses after etcd returns
	eventually(t, "etcd degraded", func() bool { return slices.Contains(r.Degraded(), "etcd") })
	if !strings.Contains(logs.String(), `msg="dependency degraded" component=etcd`) {
		t.Errorf("no degraded line for etcd in\n%s", logs.String())
	}

	rig.etcd.Resume(t)
	eventually(t, "etcd back", func() bool { return !slices.Contains(r.Degraded(), "etcd") })
	eventually(t, "w9's lapsed lease seen", func() bool { return strings.Contains(logs.String(), "keeps its place") })
	if got, err := rig.cli.Get(context.Background(), bus.WorkerKey(r.cfg.Namespace, "w9")); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("w9's key still in etcd (%v): the lease did not lapse", err)
	}
	if got := r.Index().Stats().Entries; got != rig.blocks {
		t.Errorf("index holds %d entries while w9 re-registers, want %d", got, rig.blocks)
	}
	rig.register(t)
	eventually(t, "w9 back", func() bool { return strings.Contains(logs.String(), "worker back within the lease-flap grace") })
	if n := notReady.Load(); n != 0 {
		t.Errorf("the router was not ready (or had no workers) in %d samples around etcd's restart", n)
	}
	if got := r.Index().Stats().Entries; got != rig.blocks {
		t.Errorf("after the re-registration the index holds %d entries, want %d", got, rig.blocks)
	}
	if !strings.Contains(logs.String(), `msg="dependency recovered" component=etcd`) {
		t.Errorf("no recovery line for etcd in\n%s", logs.String())
	}
}

// With etcd away at start the router starts at once, degraded and not
// ready (it knows no workers), and turns ready when etcd answers.
func TestEtcdAwayAtStart(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	cli := e.Client(t)
	spec := `{"id":"w0","model":"` + model + `","address":"10.0.0.1:8000","block_size":16}`
	if _, err := cli.Put(context.Background(), bus.WorkerKey("default", "w0"), spec); err != nil {
		t.Fatal(err)
	}
	e.Stop()
	cfg := testConfig(t)
	cfg.EtcdEndpoints, cfg.NATSURL = e.Endpoints, testenv.StartNATS(t).URL
	var logs testenv.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	// Start returned because the probe saw etcd away, not because the
	// wait for the first full view ran out.
	if out := logs.String(); !strings.Contains(out, "unreachable at start") || strings.Contains(out, "not synced after") {
		t.Errorf("Start did not end on etcd being away:\n%s", out)
	}
	if !slices.Contains(r.Degraded(), "etcd") || r.Ready() {
		t.Fatalf("degraded %v, ready %v: want etcd degraded and not ready", r.Degraded(), r.Ready())
	}
	e.Resume(t)
	eventually(t, "ready once etcd answers", r.Ready)
	if len(r.Degraded()) != 0 {
		t.Errorf("still degraded: %v", r.Degraded())
	}
}
