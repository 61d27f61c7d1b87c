package sim

import (
	"context"
	"time"
)

// WatchConnections logs the state of the fleet's NATS and etcd connections
// until ctx ends: one line when each is first reachable (or not), a warning
// every period while one is unreachable, and a line when it comes back. A
// fleet without NATS or etcd logs nothing for it.
func (f *Fleet) WatchConnections(ctx context.Context, period time.Duration) {
	var natsUp, etcdUp *bool
	check := func() {
		if f.nc != nil {
			up := f.nc.IsConnected()
			switch {
			case !up:
				f.log.Warn("NATS unreachable; KV events and load reports are not reaching any router, retrying", "url", f.natsURL)
			case natsUp == nil || !*natsUp:
				f.log.Info("NATS connected", "url", f.nc.ConnectedUrl())
			}
			natsUp = &up
		}
		if f.etcd != nil {
			eps := f.etcd.Endpoints()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := f.etcd.Status(cctx, eps[0])
			cancel()
			up := err == nil
			switch {
			case ctx.Err() != nil:
				return
			case !up:
				f.log.Warn("etcd unreachable; workers are not registered, so routers reading etcd do not see them, retrying", "endpoints", eps, "err", err)
			case etcdUp == nil || !*etcdUp:
				f.log.Info("etcd reachable; workers registered under a lease", "endpoints", eps)
			}
			etcdUp = &up
		}
	}
	check()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}
