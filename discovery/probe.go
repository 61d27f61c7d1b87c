package discovery

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The etcd client resumes a broken watch by itself and says nothing while
// it retries, so an etcd outage would be invisible to the watcher: probe
// tells it. It reads one key (a linearizable read: it needs a quorum) every
// WatchOptions.ProbeInterval and reports each change of etcd's reachability
// to WatchOptions.OnHealth.

// probe runs until ctx ends. The first answer is reported only when etcd
// is away (a healthy start is not news); after that every change is.
func (w *Watcher) probe(ctx context.Context) {
	if w.opts.OnHealth == nil {
		return
	}
	every := w.opts.ProbeInterval
	t := time.NewTicker(every)
	defer t.Stop()
	up, known := true, false
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*every)
		_, err := w.cli.Get(pctx, w.prefix, clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		if now := err == nil; now != up || !known && !now {
			up = now
			w.opts.OnHealth(up, err)
		}
		known = true
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
