package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// An etcd outage is reported when it starts and when it ends; the etcd
// client's own silent retries hid it before.
func TestWatcherReportsEtcdOutage(t *testing.T) {
	testenv.Quiet()
	e := testenv.StartEtcd(t)
	cli := e.Client(t)
	health := make(chan bool, 16)
	w := newWatcher(t, cli)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx, newFleetSink(), &observer{ups: health}) }()
	defer func() { cancel(); <-done }()
	<-w.Synced()

	expect := func(want bool) {
		t.Helper()
		select {
		case up := <-health:
			if up != want {
				t.Fatalf("Observer.Health(up=%v), want %v", up, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no Observer.Health(up=%v) within 10 s", want)
		}
	}
	e.Stop() // ~7 s: etcd waits out its request timeout for the open watch
	expect(false)
	e.Resume(t)
	expect(true)
	select {
	case up := <-health:
		t.Fatalf("extra Observer.Health(up=%v)", up)
	case <-time.After(300 * time.Millisecond):
	}
}
