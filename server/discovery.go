package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/discovery/file"
	"github.com/kvroute/kvroute/discovery/kubepool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// workerSource is one way of discovering workers, as the router wires it:
// which configuration chooses it, how logs, metrics and Degraded name it,
// and how it is opened. Adding a source is a package under discovery/ and
// one row of workerSources.
type workerSource struct {
	// what names it in the "exactly one source" errors.
	what string
	// chosen reports whether a configuration asks for it.
	chosen func(*Config) bool
	// name starts its start-up warnings ("<name> not synced after 10s").
	name string
	// synced is the log message once it has synced.
	synced string
	// label is its value of the source label of
	// kvroute_discovery_bad_records_total.
	label string
	// dep is the dependency Degraded lists while its backend is away (a
	// key of degradedEffect); "" for a source without one.
	dep string
	// open builds the source and the attributes that say where it reads,
	// for the start's log lines.
	open func(*Server) (discovery.Source, []any, error)
}

// workerSources are the worker sources, in the order errors list them.
var workerSources = []workerSource{
	{what: "etcd endpoints", chosen: func(c *Config) bool { return len(c.EtcdEndpoints) > 0 },
		name: "etcd", synced: "etcd synced", label: "etcd", dep: depEtcd, open: (*Server).openEtcd},
	{what: "a workers file", chosen: func(c *Config) bool { return c.WorkersFile != "" },
		name: "workers file", synced: "workers file loaded", label: "file", open: (*Server).openWorkersFile},
	{what: "an InferencePool name", chosen: func(c *Config) bool { return c.PoolName != "" },
		name: "inferencepool", synced: "inferencepool synced", label: "inferencepool", dep: depKube, open: (*Server).openPool},
}

// workerSource returns the one worker source c asks for.
func (c *Config) workerSource() (*workerSource, error) {
	var chosen []*workerSource
	whats := make([]string, len(workerSources))
	for i := range workerSources {
		ws := &workerSources[i]
		whats[i] = ws.what
		if ws.chosen(c) {
			chosen = append(chosen, ws)
		}
	}
	oneOf := strings.Join(whats[:len(whats)-1], ", ") + " or " + whats[len(whats)-1]
	switch len(chosen) {
	case 1:
		return chosen[0], nil
	case 0:
		return nil, errors.New("no worker discovery: give " + oneOf)
	}
	got := make([]string, len(chosen))
	for i, ws := range chosen {
		got[i] = ws.what
	}
	return nil, fmt.Errorf("worker discovery sources are exclusive, got %v: give one of %s", got, oneOf)
}

// source is the worker source a router runs.
type source struct {
	discovery.Source
	kind  *workerSource
	where []any // log attributes: where it reads
}

// openSource builds the configured worker source; nothing runs yet.
func (r *Server) openSource() (*source, error) {
	kind, err := r.cfg.workerSource()
	if err != nil {
		return nil, err
	}
	src, where, err := kind.open(r)
	if err != nil {
		return nil, err
	}
	return &source{Source: src, kind: kind, where: where}, nil
}

func (r *Server) addressPolicy() *discovery.AddressPolicy {
	return &discovery.AddressPolicy{Allow: r.cfg.AllowAddressRanges}
}

func (r *Server) openEtcd() (discovery.Source, []any, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: r.cfg.EtcdEndpoints, Username: r.cfg.EtcdUsername, Password: r.cfg.EtcdPassword,
		// The client's own logger would print every retried call while etcd
		// is away; the watcher's probe says it once.
		TLS: r.cfg.EtcdTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("etcd client: %w", err)
	}
	r.etcd = cli // closed by teardown
	w, err := etcd.New(etcd.Config{Client: cli, Namespace: r.cfg.Namespace, Policy: r.addressPolicy(),
		FlapGrace: r.cfg.Recovery.LeaseFlapGrace, Logger: r.log})
	return w, []any{"endpoints", redactURLs(r.cfg.EtcdEndpoints)}, err
}

func (r *Server) openWorkersFile() (discovery.Source, []any, error) {
	w, err := file.New(file.Config{Path: r.cfg.WorkersFile, Interval: r.cfg.WorkersFileInterval, Policy: r.addressPolicy(), Logger: r.log})
	return w, []any{"path", r.cfg.WorkersFile, "reload_every", r.cfg.WorkersFileInterval}, err
}

func (r *Server) openPool() (discovery.Source, []any, error) {
	rest, err := kubepool.RESTConfig(r.cfg.Kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	ns := r.cfg.PoolNamespace
	if ns == "" {
		ns = "default"
	}
	w, err := kubepool.New(kubepool.Config{PoolName: r.cfg.PoolName, PoolNamespace: ns, REST: rest, Defaults: r.cfg.PoolDefaults, Logger: r.log})
	return w, []any{"pool", ns + "/" + r.cfg.PoolName}, err
}

// startSyncWait bounds how long a start waits for discovery's first pass.
const startSyncWait = 10 * time.Second

// startDiscovery runs the worker source into the fleet and waits for its
// first full view, 10 s at most, or less when the source reports its
// backend away: the router then serves, not ready, until discovery
// catches up.
func (r *Server) startDiscovery() {
	src := r.src
	obs := &sourceObserver{r: r, kind: src.kind, away: make(chan struct{})}
	start := time.Now()
	r.goRun(func() error { _ = src.Run(r.ctx, r.fleet, obs); return nil })

	wait, stop := context.WithCancel(r.ctx)
	defer stop()
	go func() {
		select {
		case <-obs.away:
			stop()
		case <-wait.Done():
		}
	}()
	if discovery.WaitSynced(wait, src, startSyncWait) {
		r.markSynced() // readiness: discovery synced
		r.log.Info(src.kind.synced, slices.Concat(src.where, []any{"workers", r.fleet.len(), "took", time.Since(start).Round(time.Millisecond)})...)
		return
	}
	go func() {
		select {
		case <-src.Synced():
			r.markSynced()
		case <-r.ctx.Done():
		}
	}()
	select {
	case <-obs.away:
		r.log.Warn(src.kind.name+" unreachable at start; serving without workers until it answers", src.where...)
	default:
		r.log.Warn(src.kind.name+" not synced after 10s; serving without workers until it is", src.where...)
	}
}

// markSynced records discovery's first full view: restored workers it
// does not hold go, and xDS and the state file may now publish the fleet,
// even an empty one.
func (r *Server) markSynced() {
	r.fleet.dropRestored()
	r.synced.Store(true)
	r.notifyXDS()
	r.notifyState()
}

// sourceObserver takes the worker source's reports into the router: bad
// records into kvroute_discovery_bad_records_total (the source logged
// them), its backend's reachability into the fleet's hold and Degraded.
type sourceObserver struct {
	r        *Server
	kind     *workerSource
	away     chan struct{} // closed at the first outage
	awayOnce sync.Once
}

func (o *sourceObserver) BadRecord(string, error) {
	o.r.metrics.badRecords.WithLabelValues(o.kind.label).Inc()
}

func (o *sourceObserver) Health(err error) {
	o.r.fleet.sourceHealth(err == nil)
	if o.kind.dep == "" {
		return
	}
	if err == nil {
		o.r.dependencyUp(o.kind.dep)
		return
	}
	o.r.dependencyDown(o.kind.dep, err)
	o.awayOnce.Do(func() { close(o.away) })
}
