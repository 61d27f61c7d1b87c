package etcd

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func testRecord(id string) fleet.Worker {
	return fleet.Worker{ID: id, Model: "m", Address: "127.0.0.1:8000", BlockSize: 16, KVTotalBlocks: 100}
}

func etcdClient(t *testing.T) *clientv3.Client {
	t.Helper()
	e := testenv.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func quietOpts(ttl time.Duration) RegisterOptions {
	return RegisterOptions{TTL: ttl, RetryInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
}

// getRecord reads the key and its lease; ok is false when absent.
func getRecord(t *testing.T, cli *clientv3.Client, key string) (fleet.Worker, clientv3.LeaseID, bool) {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return fleet.Worker{}, 0, false
	}
	rec, err := discovery.ParseRecord(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return rec, clientv3.LeaseID(resp.Kvs[0].Lease), true
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRegisterWritesTheRecordUnderALeaseAndCloseDeletesIt(t *testing.T) {
	cli := etcdClient(t)
	ctx := context.Background()
	reg, err := Register(ctx, cli, "ns", testRecord("w0"), quietOpts(0))
	if err != nil {
		t.Fatal(err)
	}
	rec, lease, ok := getRecord(t, cli, bus.WorkerKey("ns", "w0"))
	if !ok || rec.ID != "w0" || rec.Address != "127.0.0.1:8000" {
		t.Fatalf("record %+v present=%v", rec, ok)
	}
	if lease == 0 || lease != reg.Lease() {
		t.Fatalf("key lease %d, registration lease %d", lease, reg.Lease())
	}
	ttl, err := cli.TimeToLive(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 10 {
		t.Fatalf("granted TTL %d, want the default 10 s", ttl.GrantedTTL)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := getRecord(t, cli, bus.WorkerKey("ns", "w0")); ok {
		t.Fatal("record still present after Close")
	}
	if err := reg.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestRegisterKeepsALeaseAliveBeyondItsTTL(t *testing.T) {
	cli := etcdClient(t)
	reg, err := Register(context.Background(), cli, "ns", testRecord("w1"), quietOpts(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	waitKeptAlive(t, cli, reg, bus.WorkerKey("ns", "w1"))
}

// waitKeptAlive waits until one of reg's leases is still alive, holding the
// record, a second longer than the TTL etcd granted it after it was first
// seen: only keepalives can have done that. It watches the lease rather
// than sleeping a fixed time: on a loaded machine a short lease may lapse
// once and be registered again, which is Register doing its job; what must
// not happen is a lease that is never renewed (the deadline is generous so
// only that fails).
func waitKeptAlive(t *testing.T, cli *clientv3.Client, reg *Registration, key string) {
	t.Helper()
	var (
		lease clientv3.LeaseID
		since time.Time
	)
	waitFor(t, "the lease to be kept alive past its TTL", 60*time.Second, func() bool {
		cur := reg.Lease()
		resp, err := cli.TimeToLive(context.Background(), cur)
		if err != nil || resp.TTL < 0 {
			lease = 0 // gone: wait for the next registration
			return false
		}
		if cur != lease {
			lease, since = cur, time.Now()
			return false
		}
		_, held, ok := getRecord(t, cli, key)
		return ok && held == cur && time.Since(since) > time.Duration(resp.GrantedTTL)*time.Second+time.Second
	})
}

func TestRegisterRecoversFromALostLease(t *testing.T) {
	cli := etcdClient(t)
	reg, err := Register(context.Background(), cli, "ns", testRecord("w2"), quietOpts(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	old := reg.Lease()
	// Revoking the lease deletes the key, exactly what an expiry during an
	// etcd outage does.
	if _, err := cli.Revoke(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "re-registration", 10*time.Second, func() bool {
		_, lease, ok := getRecord(t, cli, bus.WorkerKey("ns", "w2"))
		return ok && lease != old && lease == reg.Lease()
	})
	if n := reg.Registrations(); n < 2 {
		t.Fatalf("registrations %d, want at least 2", n)
	}
}

func TestAbandonLetsTheLeaseExpire(t *testing.T) {
	cli := etcdClient(t)
	reg, err := Register(context.Background(), cli, "ns", testRecord("w3"), quietOpts(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	reg.Abandon()
	if _, _, ok := getRecord(t, cli, bus.WorkerKey("ns", "w3")); !ok {
		t.Fatal("Abandon deleted the record at once; it should wait for the lease")
	}
	waitFor(t, "lease expiry", 10*time.Second, func() bool {
		_, _, ok := getRecord(t, cli, bus.WorkerKey("ns", "w3"))
		return !ok
	})
}

func TestRegisterStopsWithItsContext(t *testing.T) {
	cli := etcdClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	reg, err := Register(ctx, cli, "ns", testRecord("w4"), quietOpts(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-reg.done:
	case <-time.After(5 * time.Second):
		t.Fatal("keepalive loop did not stop with its context")
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := getRecord(t, cli, bus.WorkerKey("ns", "w4")); ok {
		t.Fatal("record present after Close")
	}
}

func TestRegisterRejectsBadInput(t *testing.T) {
	cli := etcdClient(t)
	tests := []struct {
		name string
		ns   string
		rec  fleet.Worker
	}{
		{"invalid record", "ns", fleet.Worker{ID: "bad/id", Model: "m", Address: "x:1", BlockSize: 16}},
		{"empty namespace", "", testRecord("w5")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Register(context.Background(), cli, tt.ns, tt.rec, quietOpts(0)); err == nil {
				t.Fatal("Register accepted bad input")
			}
		})
	}
}
