package etcd

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/sourcetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdBackend is an embedded etcd the contract writes records into.
type etcdBackend struct{ cli *clientv3.Client }

func (b etcdBackend) Open(t *testing.T) discovery.Source { return newWatcher(t, b.cli) }

func (b etcdBackend) Put(t *testing.T, w fleet.Worker) {
	putJSON(t, b.cli, bus.WorkerKey("ns", w.ID), w)
}

func (b etcdBackend) Delete(t *testing.T, id string) {
	if _, err := b.cli.Delete(context.Background(), bus.WorkerKey("ns", id)); err != nil {
		t.Fatal(err)
	}
}

func (b etcdBackend) PutBad(t *testing.T) {
	if _, err := b.cli.Put(context.Background(), bus.WorkerKey("ns", "bad"), "{not json"); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherKeepsTheSourceContract(t *testing.T) {
	testenv.Quiet()
	sourcetest.Run(t, etcdBackend{testenv.StartEtcd(t).Client(t)})
}
