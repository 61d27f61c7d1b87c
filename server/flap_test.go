package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// flapRig is a router on real etcd and NATS with one leased worker, w9,
// whose KV events put blocks in the index.
type flapRig struct {
	r      *Server
	etcd   *testenv.Etcd
	cli    *clientv3.Client
	spec   fleet.Worker
	blocks int
	reg    *etcd.Registration // w9's first registration
}

func startFlapRig(t *testing.T, grace time.Duration, logger ...*slog.Logger) *flapRig {
	t.Helper()
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(t)
	if len(logger) > 0 {
		cfg.Logger = logger[0]
	}
	cfg.EtcdEndpoints, cfg.NATSURL = e.Endpoints, n.URL
	cfg.Recovery.LeaseFlapGrace = grace
	r := start(t, cfg)
	cli := e.Client(t)
	rig := &flapRig{r: r, etcd: e, cli: cli, spec: fleet.Worker{ID: "w9", Model: model, Address: "10.0.0.9:8000", BlockSize: 16, KVTotalBlocks: 100}}
	rig.reg = rig.register(t)
	eventually(t, "w9 registered", r.Ready)

	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tokens := promptTokens(t, chatBody(100))
	rig.blocks = len(tokens) / 16
	hs := make([]vllmwire.EngineHash, rig.blocks)
	for i := range hs {
		hs[i] = vllmwire.HashInt(int64(i + 1))
	}
	batch := vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: tokens[:rig.blocks*16], BlockSize: 16}}}
	if err := bus.PublishEvents(nc, cfg.Namespace, "w9", 0, batch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "index holds w9's blocks", func() bool { return r.Index().Stats().Entries == rig.blocks })
	return rig
}

func (rig *flapRig) register(t *testing.T) *etcd.Registration {
	t.Helper()
	reg, err := etcd.Register(context.Background(), rig.cli, rig.r.cfg.Namespace, rig.spec, etcd.RegisterOptions{TTL: 10 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Abandon)
	return reg
}

// An etcd lease flap (the lease lapses, the same worker registers again)
// keeps the worker's index entries; before, every flap purged the index.
func TestLeaseFlapKeepsIndexEntries(t *testing.T) {
	rig := startFlapRig(t, time.Minute)
	r := rig.r
	if err := unregister(rig); err != nil {
		t.Fatal(err)
	}
	eventually(t, "w9 removed after its lease lapsed", func() bool { return !r.Ready() })
	if got := r.Index().Stats().Entries; got != rig.blocks {
		t.Fatalf("index holds %d entries during the grace, want %d", got, rig.blocks)
	}
	rig.register(t)
	eventually(t, "w9 back", r.Ready)
	if got := r.Index().Stats().Entries; got != rig.blocks {
		t.Fatalf("after the flap the index holds %d entries, want %d", got, rig.blocks)
	}
	// A different incarnation (the worker moved) starts from nothing.
	if err := unregister(rig); err != nil {
		t.Fatal(err)
	}
	eventually(t, "w9 removed again", func() bool { return !r.Ready() })
	rig.spec.Address = "10.0.0.10:8000"
	rig.register(t)
	eventually(t, "w9 back at a new address", r.Ready)
	if got := r.Index().Stats().Entries; got != 0 {
		t.Fatalf("a moved worker kept %d index entries, want 0", got)
	}
}

// Past the grace the removed worker's entries go.
func TestRemovedWorkerEntriesDropAfterGrace(t *testing.T) {
	rig := startFlapRig(t, 300*time.Millisecond)
	if err := unregister(rig); err != nil {
		t.Fatal(err)
	}
	eventually(t, "w9's entries dropped after the grace", func() bool {
		return !rig.r.Ready() && rig.r.Index().Stats().Entries == 0 && !rig.r.Index().HasWorker("w9")
	})
}

// unregister deletes w9's key, as a lapsed lease does.
func unregister(rig *flapRig) error {
	_, err := rig.cli.Delete(context.Background(), bus.WorkerKey(rig.r.cfg.Namespace, "w9"))
	return err
}
