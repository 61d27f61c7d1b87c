package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultLeaseTTL is the lease a registration holds when RegisterOptions
// leaves TTL zero (docs/architecture.md §3.1).
const DefaultLeaseTTL = 10 * time.Second

// RegisterOptions tune Register. The zero value works.
type RegisterOptions struct {
	// TTL is the lease time-to-live, rounded down to whole seconds (at least
	// 1 s). Zero means DefaultLeaseTTL.
	TTL time.Duration
	// RetryInterval is the pause between attempts to re-register after the
	// lease was lost or etcd was unreachable. Zero means 1 s.
	RetryInterval time.Duration
	// RequestTimeout bounds each etcd call. Zero means 5 s.
	RequestTimeout time.Duration
	// Logger receives registration events. Nil means slog.Default().
	Logger *slog.Logger
}

func (o RegisterOptions) withDefaults() RegisterOptions {
	if o.TTL == 0 {
		o.TTL = DefaultLeaseTTL
	}
	if o.TTL < time.Second {
		o.TTL = time.Second
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Registration keeps one fleet.Worker in etcd under a lease: it keeps the
// lease alive, writes the record again under a fresh lease whenever the
// lease is lost (expired during an etcd outage, revoked, or the keepalive
// stream broke), and deletes it on Close.
type Registration struct {
	cli  *clientv3.Client
	key  string
	val  string
	opts RegisterOptions

	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	lease clientv3.LeaseID
	// registrations counts successful writes of the record (1 after Register).
	registrations int
	closed        bool
}

// Register writes rec at bus.WorkerKey(namespace, rec.ID) under a new lease and keeps
// it there until ctx ends, Close or Abandon is called. The first write
// happens before Register returns, so an unreachable etcd is an error here;
// later outages are retried in the background.
func Register(ctx context.Context, cli *clientv3.Client, namespace string, rec fleet.Worker, opts RegisterOptions) (*Registration, error) {
	if cli == nil {
		return nil, errors.New("register worker: nil etcd client")
	}
	if namespace == "" {
		return nil, errors.New("register worker: empty namespace")
	}
	if err := discovery.ValidateRecord(rec); err != nil {
		return nil, fmt.Errorf("register worker: %w", err)
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("register worker %q: %w", rec.ID, err)
	}
	r := &Registration{
		cli:  cli,
		key:  bus.WorkerKey(namespace, rec.ID),
		val:  string(val),
		opts: opts.withDefaults(),
		done: make(chan struct{}),
	}
	lease, err := r.put(ctx)
	if err != nil {
		return nil, err
	}
	r.lease, r.registrations = lease, 1
	loopCtx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go r.run(loopCtx, lease)
	return r, nil
}

// Key returns the etcd key the record is written to.
func (r *Registration) Key() string { return r.key }

// Lease returns the lease currently holding the record.
func (r *Registration) Lease() clientv3.LeaseID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// Registrations counts how many times the record has been written: 1 after
// Register, one more after each recovery from a lost lease.
func (r *Registration) Registrations() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registrations
}

// put grants a lease and writes the record under it.
func (r *Registration) put(ctx context.Context) (clientv3.LeaseID, error) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.RequestTimeout)
	defer cancel()
	g, err := r.cli.Grant(cctx, int64(r.opts.TTL/time.Second))
	if err != nil {
		return 0, fmt.Errorf("register worker at %s: grant lease: %w", r.key, err)
	}
	if _, err := r.cli.Put(cctx, r.key, r.val, clientv3.WithLease(g.ID)); err != nil {
		// Best effort: an orphan lease expires by itself.
		_, _ = r.cli.Revoke(cctx, g.ID)
		return 0, fmt.Errorf("register worker at %s: put: %w", r.key, err)
	}
	return g.ID, nil
}

// run keeps the lease alive and re-registers when it is lost, until ctx ends.
func (r *Registration) run(ctx context.Context, lease clientv3.LeaseID) {
	defer close(r.done)
	log := r.opts.Logger.With("key", r.key)
	for {
		r.keepAlive(ctx, lease)
		if ctx.Err() != nil {
			return
		}
		log.Warn("etcd lease lost; registering again", "lease", int64(lease))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.opts.RetryInterval):
			}
			l, err := r.put(ctx)
			if err == nil {
				lease = l
				r.mu.Lock()
				r.lease = l
				r.registrations++
				r.mu.Unlock()
				log.Info("registered again in etcd", "lease", int64(l))
				break
			}
			if ctx.Err() != nil {
				return
			}
			log.Warn("etcd registration failed; retrying", "err", err, "retry_in", r.opts.RetryInterval)
		}
	}
}

// keepAlive returns when the lease can no longer be kept alive or ctx ends.
// The etcd client closes the channel once the lease's TTL passes without a
// successful renewal, so an outage longer than the TTL ends up here.
func (r *Registration) keepAlive(ctx context.Context, lease clientv3.LeaseID) {
	ch, err := r.cli.KeepAlive(ctx, lease)
	if err != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case resp, ok := <-ch:
			if !ok || resp == nil || resp.TTL <= 0 {
				return
			}
		}
	}
}

// stop ends the background loop and reports the lease it held, once.
func (r *Registration) stop() (clientv3.LeaseID, bool) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return 0, false
	}
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	<-r.done
	return r.Lease(), true
}

// Close stops the keepalive and revokes the lease, which deletes the record
// at once: the clean-shutdown path. It is safe to call more than once.
func (r *Registration) Close() error {
	lease, ok := r.stop()
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.RequestTimeout)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, lease); err != nil {
		return fmt.Errorf("deregister worker at %s: revoke lease: %w", r.key, err)
	}
	return nil
}

// Abandon stops the keepalive without deleting the record, which then
// disappears when the lease expires, as it would if the worker crashed.
func (r *Registration) Abandon() { r.stop() }
