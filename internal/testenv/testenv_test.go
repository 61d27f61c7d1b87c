package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestNATSRoundTripAndRestart(t *testing.T) {
	n := StartNATS(t)
	nc, err := nats.Connect(n.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("a.b")
	if err != nil {
		t.Fatal(err)
	}
	n.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for nc.Status() != nats.CONNECTED && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := nc.Publish("a.b", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no message after restart: %v", err)
	}
	if string(msg.Data) != "hi" {
		t.Fatalf("got %q", msg.Data)
	}
}

func TestEtcdLeaseExpires(t *testing.T) {
	e := StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/k", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := cli.Get(ctx, "/k")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("lease never expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
