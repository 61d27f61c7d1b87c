// Package etcd is the etcd side of worker discovery: Watcher, a
// discovery.Source that mirrors the records under a namespace's worker
// prefix, and Register, which workers (kvsim, kvbridge) use to keep their
// record there under a lease. The key layout and the record are the
// contract of docs/architecture.md §3.1.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Config configures a Watcher.
type Config struct {
	// Client reaches etcd; the caller closes it after Run returns.
	Client *clientv3.Client
	// Namespace scopes the worker keys (bus.WorkersPrefix).
	Namespace string
	// Policy refuses worker addresses; nil is the default policy.
	Policy *discovery.AddressPolicy
	// FlapGrace is how long a removed worker's state is kept in case its
	// lease lapsed and the same worker registers again (--lease-flap-grace);
	// see Watcher.FlapGrace.
	FlapGrace time.Duration
	// RetryInterval is the pause before a new Get after etcd failed or the
	// watch was compacted. Zero means 1 s.
	RetryInterval time.Duration
	// ProbeInterval is how often etcd's reachability is checked for
	// Observer.Health; a probe waits twice this long for an answer. Zero
	// means 1 s.
	ProbeInterval time.Duration
	// Logger receives watch events. Nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports the settings that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("no etcd client"))
	}
	if !discovery.ValidName(c.Namespace) {
		errs = append(errs, fmt.Errorf("namespace %q: want 1-%d characters of [A-Za-z0-9_-]", c.Namespace, discovery.MaxIDLen))
	}
	if c.FlapGrace < 0 || c.RetryInterval < 0 || c.ProbeInterval < 0 {
		errs = append(errs, errors.New("flap grace, retry and probe intervals must not be negative"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("etcd discovery: %w", errors.Join(errs...))
	}
	return nil
}

// Watcher mirrors a namespace's worker records from etcd into a Sink: an
// initial Get, then a Watch from the revision after it. A delete or a lease
// lapse removes the worker. After a compaction or a broken watch it gets
// everything again and removes the workers that disappeared meanwhile.
// While etcd is away it keeps the last known workers; a probe reads one
// key every ProbeInterval (a linearizable read: it needs a quorum) and
// reports each change of etcd's reachability to the Observer.
type Watcher struct {
	cli    *clientv3.Client
	prefix string
	cfg    Config

	// Set by Run, used by its goroutine only.
	sink  fleet.Sink
	obs   discovery.Observer
	known map[string]fleet.Worker
	// leases holds the lease each known worker's key was written under.
	leases map[string]int64

	bad     atomic.Int64
	synced  chan struct{}
	syncOne sync.Once
}

// New checks cfg and returns a Watcher over its namespace; Run starts it.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Watcher{cli: cfg.Client, prefix: bus.WorkersPrefix(cfg.Namespace), cfg: cfg,
		known: map[string]fleet.Worker{}, leases: map[string]int64{}, synced: make(chan struct{})}, nil
}

var _ discovery.Source = (*Watcher)(nil)

// Synced is closed once the first Get has been applied to the Sink.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// FlapGrace is Config.FlapGrace: a worker whose lease lapsed (while etcd
// was away, or a keepalive that broke) registers the same record again.
func (w *Watcher) FlapGrace() time.Duration { return w.cfg.FlapGrace }

// BadValues counts the invalid values seen so far.
func (w *Watcher) BadValues() int64 { return w.bad.Load() }

// Run watches until ctx ends, then returns ctx's error.
func (w *Watcher) Run(ctx context.Context, sink fleet.Sink, obs discovery.Observer) error {
	if obs == nil {
		obs = discovery.NopObserver{}
	}
	w.sink, w.obs = sink, obs
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		every := w.cfg.ProbeInterval
		discovery.Probe(ctx, discovery.NewReachability(obs), every, 2*every, func(ctx context.Context) error {
			_, err := w.cli.Get(ctx, w.prefix, clientv3.WithCountOnly())
			return err
		})
	}()
	defer func() { <-probed }()
	for {
		rev, err := w.resync(ctx)
		if err == nil {
			w.syncOne.Do(func() { close(w.synced) })
			err = w.watch(ctx, rev+1)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.cfg.Logger.Warn("etcd worker watch interrupted; resyncing", "prefix", w.prefix, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(w.cfg.RetryInterval):
		}
	}
}

// resync reads every record and makes the Sink match it.
func (w *Watcher) resync(ctx context.Context) (int64, error) {
	resp, err := w.cli.Get(ctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("discovery: get %s: %w", w.prefix, err)
	}
	present := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if id, ok := w.put(string(kv.Key), kv.Value, kv.Lease); ok {
			present[id] = true
		} else if id != "" {
			present[id] = w.known[id].ID != "" // keep a known worker whose value went bad
		}
	}
	for id := range w.known {
		if !present[id] {
			w.remove(id)
		}
	}
	return resp.Header.Revision, nil
}

func (w *Watcher) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range w.cli.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("discovery: watch %s: %w", w.prefix, err)
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			switch ev.Type {
			case clientv3.EventTypePut:
				w.put(key, ev.Kv.Value, ev.Kv.Lease)
			case clientv3.EventTypeDelete:
				if id, err := w.idOf(key); err == nil {
					w.remove(id)
				}
			}
		}
	}
	return fmt.Errorf("discovery: watch %s closed", w.prefix)
}

// put applies one key's value; it returns the key's worker id ("" when the
// key itself is malformed) and whether the value was a valid record.
func (w *Watcher) put(key string, value []byte, lease int64) (string, bool) {
	id, err := w.idOf(key)
	if err != nil {
		w.badValue(key, err)
		return "", false
	}
	rec, err := discovery.ParseRecordWith(value, w.cfg.Policy)
	if err == nil && rec.ID != id {
		err = fmt.Errorf("record id %q does not match its key's id %q", rec.ID, id)
	}
	if err != nil {
		w.badValue(key, err)
		return id, false
	}
	if old, ok := w.leases[id]; ok && old != 0 && lease != 0 && old != lease {
		// Written again under a new lease while the old lease still held
		// the key (no delete came between): a new process registered, or
		// the old one lost its keepalive and registered again.
		if rs, ok := w.sink.(fleet.RestartSink); ok {
			rs.Restarted(id)
		}
	}
	w.leases[id] = lease
	w.known[id] = rec
	w.sink.Upsert(rec)
	return id, true
}

func (w *Watcher) remove(id string) {
	if _, ok := w.known[id]; !ok {
		return
	}
	delete(w.known, id)
	delete(w.leases, id)
	w.sink.Remove(id)
}

func (w *Watcher) idOf(key string) (string, error) {
	id, ok := strings.CutPrefix(key, w.prefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", fmt.Errorf("key %q is not %s<worker_id>", key, w.prefix)
	}
	return id, nil
}

func (w *Watcher) badValue(key string, err error) {
	w.bad.Add(1)
	w.cfg.Logger.Warn("ignoring bad worker record", "key", key, "err", err)
	w.obs.BadRecord(key, err)
}
