package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// outageEtcd is an embedded etcd that a test can stop and start again on
// the same ports and data, to play an outage. (testenv's etcd cannot
// restart.)
type outageEtcd struct {
	cfg *embed.Config
	e   *embed.Etcd
}

func newOutageEtcd(t *testing.T) *outageEtcd {
	t.Helper()
	var err error
	// A port picked free can be taken by another test process before etcd
	// binds it; pick again then.
	for range 5 {
		o := &outageEtcd{cfg: outageConfig(t)}
		if err = o.tryStart(); err == nil {
			t.Cleanup(func() {
				if o.e != nil {
					o.e.Close()
				}
			})
			return o
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("start etcd: %v", err)
	return nil
}

func outageConfig(t *testing.T) *embed.Config {
	port := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port()))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port()))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	return cfg
}

func (o *outageEtcd) start(t *testing.T) {
	t.Helper()
	if err := o.tryStart(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
}

func (o *outageEtcd) tryStart() error {
	e, err := embed.StartEtcd(o.cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return errors.New("etcd not ready after 30 s")
	}
	o.e = e
	return nil
}

func (o *outageEtcd) stop() {
	o.e.Close()
	o.e = nil
}

func TestRegisterComesBackAfterAnEtcdOutageLongerThanTheTTL(t *testing.T) {
	et := newOutageEtcd(t)
	// Reconnect quickly once etcd is back instead of gRPC's default backoff.
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{et.cfg.ListenClientUrls[0].String()}, DialTimeout: 2 * time.Second,
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
	var logs syncBuffer
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

	// Stopping takes etcd's request timeout (~7 s: it waits for the open
	// keepalive stream, which keeps the lease alive meanwhile); then etcd
	// stays down for 2.5 lease TTLs.
	et.stop()
	time.Sleep(2500 * time.Millisecond)
	et.start(t)

	waitFor(t, "re-registration after the outage", 60*time.Second, func() bool {
		_, lease, ok := getRecord(t, cli, bus.WorkerKey("ns", "w9"))
		return ok && lease != old && lease == reg.Lease()
	})
	if n := reg.Registrations(); n < 2 {
		t.Fatalf("registrations %d, want at least 2", n)
	}
	// The new lease is kept alive.
	time.Sleep(2 * time.Second)
	if _, _, ok := getRecord(t, cli, bus.WorkerKey("ns", "w9")); !ok {
		t.Fatal("record lost after re-registration")
	}
}

// syncBuffer is a bytes.Buffer safe for the registration's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
