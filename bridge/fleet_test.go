package bridge

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/nats-io/nats.go"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBridgeFleet covers membership and load: registration, leases, health,
// data-parallel ranks and load reports.
func TestBridgeFleet(t *testing.T) {
	in := startInfra(t)

	t.Run("registers model, adapters and capacity, reports load, deregisters on shutdown", func(t *testing.T) {
		ns := "reg"
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		loads := make(chan *nats.Msg, 64)
		sub, err := in.nc.ChanSubscribe(bus.LoadSubject(ns, "w0"), loads)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		_, stop := runBridge(t, bridgeConfig(in, ns, eng, es))

		key := bus.WorkerKey(ns, "w0")
		var rec fleet.Worker
		waitFor(t, "the etcd record", 10*time.Second, func() bool {
			resp, err := in.cli.Get(context.Background(), key)
			if err != nil || len(resp.Kvs) == 0 {
				return false
			}
			rec, err = discovery.ParseRecord(resp.Kvs[0].Value)
			if err != nil {
				t.Fatalf("bridge wrote an invalid record: %v", err)
			}
			if resp.Kvs[0].Lease == 0 {
				t.Fatal("record written without a lease")
			}
			return true
		})
		want := fleet.Worker{ID: "w0", Model: testModel, Address: "10.0.0.5:8000", BlockSize: 16,
			KVTotalBlocks: 1000, LoRAAdapters: []string{"sql-lora"}}
		if got, _ := json.Marshal(rec); string(got) != string(mustJSON(t, want)) {
			t.Errorf("record = %s, want %s", got, mustJSON(t, want))
		}

		select {
		case m := <-loads:
			r, err := bus.ParseLoadReport(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if r.Waiting != 3 || r.Running != 5 || r.KVUsedBlocks != 250 || r.KVTotalBlocks != 1000 {
				t.Errorf("load report %+v, want waiting 3 running 5 kv 250/1000", r)
			}
			if age := time.Since(r.Time()); age > 5*time.Second || age < -time.Second {
				t.Errorf("load report timestamp is %v old", age)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no load report")
		}

		stop() // what SIGTERM does
		resp, err := in.cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 0 {
			t.Error("record still in etcd after the bridge shut down")
		}
	})

	t.Run("an unhealthy engine leaves the fleet and rejoins when ready", func(t *testing.T) {
		ns := "health"
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		runBridge(t, bridgeConfig(in, ns, eng, es))
		key := bus.WorkerKey(ns, "w0")
		present := func() bool {
			resp, err := in.cli.Get(context.Background(), key)
			return err == nil && len(resp.Kvs) == 1
		}
		waitFor(t, "registration", 10*time.Second, present)
		eng.failing.Store(true)
		waitFor(t, "deregistration of the failing engine", 5*time.Second, func() bool { return !present() })
		eng.failing.Store(false)
		waitFor(t, "registration again", 5*time.Second, present)
	})

	t.Run("registers again after its lease is lost, as after an etcd outage", func(t *testing.T) {
		ns := "relet"
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		runBridge(t, bridgeConfig(in, ns, eng, es))
		key := bus.WorkerKey(ns, "w0")
		lease := func() clientv3.LeaseID {
			resp, err := in.cli.Get(context.Background(), key)
			if err != nil || len(resp.Kvs) == 0 {
				return 0
			}
			return clientv3.LeaseID(resp.Kvs[0].Lease)
		}
		waitFor(t, "registration", 10*time.Second, func() bool { return lease() != 0 })
		old := lease()
		// An outage longer than the TTL ends the same way: the lease is gone.
		if _, err := in.cli.Revoke(context.Background(), old); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "registration under a new lease", 10*time.Second, func() bool {
			l := lease()
			return l != 0 && l != old
		})
	})

	t.Run("killing the bridge lets the lease lapse and the worker leaves", func(t *testing.T) {
		ns := "kill"
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		cfg := bridgeConfig(in, ns, eng, es)
		cfg.Etcd = in.etcdClient(t) // the bridge's own connection, to cut
		runBridge(t, cfg)
		key := bus.WorkerKey(ns, "w0")
		waitFor(t, "registration", 10*time.Second, func() bool {
			resp, err := in.cli.Get(context.Background(), key)
			return err == nil && len(resp.Kvs) == 1
		})
		resp, err := in.cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		watch := in.cli.Watch(context.Background(), key, clientv3.WithRev(resp.Header.Revision+1))
		// A killed process sends nothing more: its etcd connection just dies.
		_ = cfg.Etcd.Close()
		start := time.Now()
		select {
		case wr := <-watch:
			if len(wr.Events) == 0 || wr.Events[0].Type != mvccpb.DELETE {
				t.Fatalf("watch: %+v, want the key deleted", wr)
			}
			if time.Since(start) < time.Second {
				t.Errorf("key gone after %v: it should take the lease TTL, not an explicit delete", time.Since(start))
			}
		case <-time.After(15 * time.Second):
			t.Fatal("the record outlived its lease")
		}
	})

	t.Run("data-parallel ranks become separate workers", func(t *testing.T) {
		ns := "dp"
		tap := tapEvents(t, in.nc, ns)
		eng := newFakeEngine(t, "vllm_metrics_dp2_old.txt")
		es := newEngineSide(t, 2, 0)
		cfg := bridgeConfig(in, ns, eng, es)
		cfg.DPSize = 2
		loads := make(chan *nats.Msg, 64)
		sub, err := in.nc.ChanSubscribe(bus.LoadSubjectWildcard(ns), loads)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		runBridge(t, cfg)
		connect(t, es.pubs[1], tap, 1)
		connect(t, es.pubs[0], tap, 0)
		for _, m := range tap.snapshot() {
			b, err := vllmwire.DecodeBatch(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if want := "kvroute.dp.events.w0-dp" + strconv.Itoa(*b.DPRank); m.Subject != want {
				t.Errorf("rank %d batch on %s, want %s", *b.DPRank, m.Subject, want)
			}
		}
		for r, want := range map[int]int{0: 2000, 1: 2000} {
			key := bus.WorkerKey(ns, "w0-dp"+strconv.Itoa(r))
			waitFor(t, key, 10*time.Second, func() bool {
				resp, err := in.cli.Get(context.Background(), key)
				if err != nil || len(resp.Kvs) == 0 {
					return false
				}
				rec, err := discovery.ParseRecord(resp.Kvs[0].Value)
				if err != nil || rec.DPRank != r || rec.BlockSize != 32 || rec.KVTotalBlocks != want {
					t.Fatalf("rank %d record %+v (err %v)", r, rec, err)
				}
				return true
			})
		}
		got := map[string]fleet.LoadReport{}
		waitFor(t, "load reports for both ranks", 5*time.Second, func() bool {
			select {
			case m := <-loads:
				r, err := bus.ParseLoadReport(m.Data)
				if err != nil {
					t.Fatal(err)
				}
				got[m.Subject] = r
			default:
			}
			return len(got) == 2
		})
		if r := got["kvroute.dp.load.w0-dp1"]; r.Waiting != 4 || r.Running != 7 || r.KVUsedBlocks != 1000 {
			t.Errorf("rank 1 load %+v, want waiting 4 running 7 used 1000", r)
		}
		if r := got["kvroute.dp.load.w0-dp0"]; r.Waiting != 0 || r.Running != 2 || r.KVUsedBlocks != 200 {
			t.Errorf("rank 0 load %+v, want waiting 0 running 2 used 200", r)
		}
	})

	t.Run("SGLang: page size from server info, capacity from token pool", func(t *testing.T) {
		ns := "sglang"
		eng := newFakeEngine(t, "sglang_metrics.txt")
		es := newEngineSide(t, 1, 0)
		cfg := bridgeConfig(in, ns, eng, es)
		cfg.Engine = engine.EngineSGLang
		b, _ := runBridge(t, cfg)
		waitFor(t, "registration", 10*time.Second, func() bool { return len(b.Records()) == 1 })
		if rec := b.Records()[0]; rec.BlockSize != 16 || rec.KVTotalBlocks != 10240 {
			t.Errorf("record %+v, want block size 16 and 163840/16 blocks", rec)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
