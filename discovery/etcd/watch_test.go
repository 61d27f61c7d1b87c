package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// recorder is a fleet.Sink that records the current fleet.
type recorder struct {
	mu      sync.Mutex
	workers map[string]fleet.Worker
	removed []string
}

func newFleetSink() *recorder { return &recorder{workers: map[string]fleet.Worker{}} }

func (f *recorder) Upsert(r fleet.Worker) { f.mu.Lock(); f.workers[r.ID] = r; f.mu.Unlock() }
func (f *recorder) Remove(id string) {
	f.mu.Lock()
	delete(f.workers, id)
	f.removed = append(f.removed, id)
	f.mu.Unlock()
}

func (f *recorder) get(id string) (fleet.Worker, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.workers[id]
	return r, ok
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newWatcher watches namespace "ns" and logs nothing.
func newWatcher(t *testing.T, cli *clientv3.Client) *Watcher {
	t.Helper()
	w, err := New(Config{Client: cli, Namespace: "ns", Logger: quietLogger(), ProbeInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// observer is a discovery.Observer that keeps what it hears.
type observer struct {
	mu  sync.Mutex
	bad []string
	ups chan bool
}

func (o *observer) BadRecord(key string, _ error) {
	o.mu.Lock()
	o.bad = append(o.bad, key)
	o.mu.Unlock()
}

func (o *observer) Health(err error) {
	if o.ups != nil {
		o.ups <- err == nil
	}
}

func (o *observer) badKeys() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.bad...)
}

func record(id string, blockSize int) fleet.Worker {
	return fleet.Worker{ID: id, Model: "m", Address: "10.0.0.1:8000", BlockSize: blockSize, KVTotalBlocks: 100}
}

func putJSON(t *testing.T, cli *clientv3.Client, key string, v any, opts ...clientv3.OpOption) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), key, string(b), opts...); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherFollowsEtcd(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// One worker registered before the router starts: the initial Get.
	pre, err := Register(ctx, cli, "ns", record("pre", 16), RegisterOptions{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pre.Close()
	// A worker of another namespace must stay invisible.
	putJSON(t, cli, bus.WorkerKey("other", "x"), record("x", 16))

	sink := newFleetSink()
	obs := &observer{}
	w := newWatcher(t, cli)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, sink, obs) }()
	select {
	case <-w.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher never synced")
	}
	if _, ok := sink.get("pre"); !ok {
		t.Fatal("worker registered before start not seen by the initial Get")
	}
	if _, ok := sink.get("x"); ok {
		t.Fatal("worker of another namespace seen")
	}

	t.Run("add", func(t *testing.T) {
		putJSON(t, cli, bus.WorkerKey("ns", "w1"), record("w1", 16))
		eventually(t, "w1 added", func() bool { _, ok := sink.get("w1"); return ok })
	})
	t.Run("update", func(t *testing.T) {
		putJSON(t, cli, bus.WorkerKey("ns", "w1"), record("w1", 32))
		eventually(t, "w1 updated", func() bool { r, _ := sink.get("w1"); return r.BlockSize == 32 })
	})
	t.Run("bad value is counted and ignored", func(t *testing.T) {
		before := w.BadValues()
		if _, err := cli.Put(ctx, bus.WorkerKey("ns", "w1"), "{not json"); err != nil {
			t.Fatal(err)
		}
		putJSON(t, cli, bus.WorkerKey("ns", "w2"), record("other-id", 16)) // id does not match its key
		putJSON(t, cli, bus.WorkerKey("ns", "w3"), fleet.Worker{ID: "w3"}) // fails validation
		putJSON(t, cli, bus.WorkerKey("ns", "w4"), record("w4", 16))       // a good one after the bad ones
		eventually(t, "w4 added", func() bool { _, ok := sink.get("w4"); return ok })
		if got := w.BadValues() - before; got != 3 {
			t.Errorf("bad values counted %d, want 3", got)
		}
		if r, ok := sink.get("w1"); !ok || r.BlockSize != 32 {
			t.Errorf("w1 after a bad update = %+v %v, want the last good record", r, ok)
		}
		for _, id := range []string{"w2", "other-id", "w3"} {
			if _, ok := sink.get(id); ok {
				t.Errorf("bad record %s reached the fleet", id)
			}
		}
		if keys := obs.badKeys(); len(keys) < 3 {
			t.Errorf("Observer.BadRecord saw %v", keys)
		}
	})
	t.Run("delete removes", func(t *testing.T) {
		if _, err := cli.Delete(ctx, bus.WorkerKey("ns", "w4")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "w4 removed", func() bool { _, ok := sink.get("w4"); return !ok })
	})
	t.Run("lease expiry removes", func(t *testing.T) {
		reg, err := Register(ctx, cli, "ns", record("leased", 16), RegisterOptions{TTL: time.Second, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "leased added", func() bool { _, ok := sink.get("leased"); return ok })
		reg.Abandon() // the worker "crashes": no more keepalives
		eventually(t, "leased expired", func() bool { _, ok := sink.get("leased"); return !ok })
	})
	t.Run("deregistration removes", func(t *testing.T) {
		if err := pre.Close(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "pre removed", func() bool { _, ok := sink.get("pre"); return !ok })
	})

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
}

func TestWatcherResyncRemovesVanishedWorkers(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	sink := newFleetSink()
	w := newWatcher(t, cli)
	w.sink, w.obs = sink, discovery.NopObserver{} // resync without Run
	for i := range 3 {
		putJSON(t, cli, bus.WorkerKey("ns", fmt.Sprintf("w%d", i)), record(fmt.Sprintf("w%d", i), 16))
	}
	if _, err := w.resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(context.Background(), bus.WorkerKey("ns", "w1")); err != nil {
		t.Fatal(err)
	}
	// A resync (as after a compacted watch) must notice w1 is gone.
	if _, err := w.resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := sink.get("w1"); ok {
		t.Error("w1 survived a resync after its deletion")
	}
	if _, ok := sink.get("w2"); !ok {
		t.Error("w2 lost in resync")
	}
}

func TestNewChecksItsConfig(t *testing.T) {
	cli := &clientv3.Client{}
	for _, cfg := range []Config{
		{Namespace: "ns"},               // no client
		{Client: cli},                   // no namespace
		{Client: cli, Namespace: "a.>"}, // not a token
		{Client: cli, Namespace: "ns", FlapGrace: -time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	w, err := New(Config{Client: cli, Namespace: "ns", FlapGrace: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g := w.FlapGrace(); g != 30*time.Second {
		t.Errorf("FlapGrace() = %v, want the configured 30s", g)
	}
}
