package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/scoring"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sink receives the fleet as discovery learns it. The watcher calls it from
// one goroutine; Upsert may repeat a record that did not change.
type Sink interface {
	// Upsert adds a worker or replaces its record.
	Upsert(scoring.WorkerSpec)
	// Remove drops a worker: its key was deleted or its lease lapsed.
	Remove(id string)
}

// WatchOptions tune a Watcher. The zero value works.
type WatchOptions struct {
	// RetryInterval is the pause before a new Get after etcd failed or the
	// watch was compacted. Zero means 1 s.
	RetryInterval time.Duration
	// OnBadValue is called for each value that is not a valid record; the
	// value is ignored (a worker already known keeps its last good record).
	OnBadValue func(key string, err error)
	// Logger receives watch events. Nil means slog.Default().
	Logger *slog.Logger
	// Policy refuses worker addresses; nil is the default policy.
	Policy *AddressPolicy
	// OnHealth, when set, is told each time etcd stops or starts answering
	// (up false with the error, then up true), from its own goroutine; a
	// start with etcd away is reported too. The watch itself keeps the last
	// known workers while etcd is away.
	OnHealth func(up bool, err error)
	// ProbeInterval is how often etcd's reachability is checked for
	// OnHealth; a probe waits twice this long for an answer. Zero means 1 s.
	ProbeInterval time.Duration
}

// Watcher mirrors a namespace's worker records from etcd into a Sink: an
// initial Get, then a Watch from the revision after it. A delete or a lease
// lapse removes the worker. After a compaction or a broken watch it gets
// everything again and removes the workers that disappeared meanwhile.
type Watcher struct {
	cli    *clientv3.Client
	prefix string
	sink   Sink
	opts   WatchOptions

	known   map[string]scoring.WorkerSpec // owned by Run's goroutine
	bad     atomic.Int64
	synced  chan struct{}
	syncOne sync.Once
}

// NewWatcher returns a Watcher over namespace's records; Run starts it.
func NewWatcher(cli *clientv3.Client, namespace string, sink Sink, opts WatchOptions) *Watcher {
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = time.Second
	}
	return &Watcher{cli: cli, prefix: bus.WorkersPrefix(namespace), sink: sink, opts: opts, known: map[string]scoring.WorkerSpec{}, synced: make(chan struct{})}
}

// Synced is closed once the first Get has been applied to the Sink.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// BadValues counts the invalid values seen so far.
func (w *Watcher) BadValues() int64 { return w.bad.Load() }

// Run watches until ctx ends, then returns ctx's error.
func (w *Watcher) Run(ctx context.Context) error {
	probed := make(chan struct{})
	go func() { defer close(probed); w.probe(ctx) }()
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
		w.opts.Logger.Warn("etcd worker watch interrupted; resyncing", "prefix", w.prefix, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(w.opts.RetryInterval):
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
		if id, ok := w.put(string(kv.Key), kv.Value); ok {
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
				w.put(key, ev.Kv.Value)
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
func (w *Watcher) put(key string, value []byte) (string, bool) {
	id, err := w.idOf(key)
	if err != nil {
		w.badValue(key, err)
		return "", false
	}
	rec, err := ParseRecordWith(value, w.opts.Policy)
	if err == nil && rec.ID != id {
		err = fmt.Errorf("record id %q does not match its key's id %q", rec.ID, id)
	}
	if err != nil {
		w.badValue(key, err)
		return id, false
	}
	w.known[id] = rec
	w.sink.Upsert(rec)
	return id, true
}

func (w *Watcher) remove(id string) {
	if _, ok := w.known[id]; !ok {
		return
	}
	delete(w.known, id)
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
	w.opts.Logger.Warn("ignoring bad worker record", "key", key, "err", err)
	if w.opts.OnBadValue != nil {
		w.opts.OnBadValue(key, err)
	}
}
