package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
)

// A router restarted while etcd is away starts on the fleet its state file
// kept: ready, routing to the worker, and serving it over xDS from its
// first snapshot. Once etcd answers, discovery's view replaces the kept
// one: a worker that left while no router ran goes.
func TestRestartDuringEtcdOutageKeepsTheFleet(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.EtcdEndpoints, cfg.NATSURL, cfg.XDSAddr = e.Endpoints, n.URL, "127.0.0.1:0"
	cfg.Recovery.StateDir = t.TempDir()
	cli := e.Client(t)
	register := func(id, addr string) *etcd.Registration {
		t.Helper()
		rec := fleet.Worker{ID: id, Model: model, Address: addr, BlockSize: 16, KVTotalBlocks: 100}
		reg, err := etcd.Register(context.Background(), cli, cfg.Namespace, rec, etcd.RegisterOptions{TTL: 2 * time.Second, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Abandon)
		return reg
	}
	register("w1", "10.0.0.1:8000")
	gone := register("w2", "10.0.0.2:8000")

	ctx, cancel := context.WithCancel(context.Background())
	a, err := Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	path := filepath.Join(cfg.Recovery.StateDir, "fleet-"+cfg.Namespace+".json")
	eventually(t, "the state file to hold both workers", func() bool {
		var st fleetState
		b, err := os.ReadFile(path)
		return err == nil && json.Unmarshal(b, &st) == nil && len(st.Workers) == 2
	})
	cancel() // the router goes; the state file stays as the last change left it
	if err := a.Wait(); err != nil {
		t.Fatal(err)
	}
	// While no router runs, w2 leaves; then etcd goes away.
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	e.Stop()

	var logs testenv.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := start(t, cfg)
	eventually(t, "ready on the kept fleet while etcd is away", b.Ready)
	if w, status := route(t, dial(t, b), chatBody(3)); status != 200 || (w != "w1" && w != "w2") {
		t.Fatalf("routed to %q (%d), want a kept worker", w, status)
	}
	dialCDS(t, b.XDSAddr()).untilEndpoints("10.0.0.1:8000", "10.0.0.2:8000")
	if n := len(regexp.MustCompile(`xds: clusters updated clusters=0`).FindAllString(logs.String(), -1)); n != 0 {
		t.Errorf("xDS published an empty cluster %d times:\n%s", n, logs.String())
	}

	// etcd answers: its view replaces the kept fleet, without w2.
	e.Resume(t)
	eventually(t, "w2 gone once etcd answers", func() bool { return b.fleet.len() == 1 })
	if recs := b.fleet.snapshot(); recs[0].ID != "w1" {
		t.Errorf("fleet %v, want w1", recs)
	}
	eventually(t, "the state file rewritten with w1 alone", func() bool {
		var st fleetState
		b, err := os.ReadFile(path)
		return err == nil && json.Unmarshal(b, &st) == nil && len(st.Workers) == 1 && st.Workers[0].ID == "w1"
	})
}

// A state file is checked as discovery checks records, and one written for
// another source or namespace is ignored.
func TestStateFileIsCheckedLikeDiscovery(t *testing.T) {
	testenv.Quiet()
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.EtcdEndpoints = []string{"127.0.0.1:1"} // never answers
	cfg.Recovery.StateDir = dir
	write := func(st fleetState) {
		t.Helper()
		if err := writeFileAtomic(filepath.Join(dir, "fleet-"+cfg.Namespace+".json"), st); err != nil {
			t.Fatal(err)
		}
	}
	good := fleet.Worker{ID: "ok", Model: model, Address: "10.0.0.4:8000", BlockSize: 16}
	meta := fleet.Worker{ID: "meta", Model: model, Address: "0xa9fea9fe:80", BlockSize: 16}
	write(fleetState{Version: stateVersion, Namespace: cfg.Namespace, Source: "etcd", Workers: []fleet.Worker{good, meta}})
	r := start(t, cfg)
	eventually(t, "the kept worker served while etcd never answers", r.Ready)
	if recs := r.fleet.snapshot(); len(recs) != 1 || recs[0].ID != "ok" {
		t.Fatalf("fleet %v, want only the good record", recs)
	}

	other := t.TempDir()
	cfg.Recovery.StateDir = other
	dir = other
	write(fleetState{Version: stateVersion, Namespace: cfg.Namespace, Source: "inferencepool", Workers: []fleet.Worker{good}})
	r2 := start(t, cfg)
	if got := r2.fleet.len(); got != 0 {
		t.Errorf("a state file of another source gave %d workers", got)
	}
	if reason := r2.NotReadyReason(); !strings.Contains(reason, "not synced") {
		t.Errorf("not-ready reason %q, want discovery not synced", reason)
	}
}
