package etcd

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// cutProxy forwards TCP connections to one address until cut: then it
// closes every open connection and closes new ones at once, as a network
// partition between a worker and etcd would, while etcd itself stays up
// (so a lease whose keepalives stop does expire on the server).
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
	})
	go p.serve()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *cutProxy) forward(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.mu.Unlock()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// setCut cuts (true) or heals (false) the link.
func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

func TestRegisterComesBackAfterAnEtcdOutageLongerThanTheTTL(t *testing.T) {
	e := testenv.StartEtcd(t)
	direct, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	proxy := newCutProxy(t, strings.TrimPrefix(e.Endpoints[0], "http://"))
	// The worker reaches etcd through the proxy; it reconnects quickly once
	// the link heals instead of after gRPC's default backoff.
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"http://" + proxy.addr()}, DialTimeout: 2 * time.Second,
		Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	opts := quietOpts(time.Second)
	opts.RequestTimeout = time.Second
	var logs testenv.SyncBuffer
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("registration log:\n%s", logs.String())
		}
	})
	reg, err := Register(context.Background(), cli, "ns", testRecord("w9"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	old := reg.Lease()
	key := bus.WorkerKey("ns", "w9")

	// Cut the worker off etcd; etcd (watched directly) expires the lease
	// once its keepalives stop, so the record goes. Keep the cut a while
	// longer, then heal it.
	proxy.setCut(true)
	waitFor(t, "the record to expire with its lease during the cut", 30*time.Second, func() bool {
		_, _, ok := getRecord(t, direct, key)
		return !ok
	})
	proxy.setCut(false)

	waitFor(t, "re-registration after the outage", 60*time.Second, func() bool {
		_, lease, ok := getRecord(t, direct, key)
		return ok && lease != old && lease == reg.Lease()
	})
	if n := reg.Registrations(); n < 2 {
		t.Fatalf("registrations %d, want at least 2", n)
	}
	// The new lease is kept alive after the outage, not just written once.
	waitKeptAlive(t, direct, reg, key)
}
