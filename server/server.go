package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine/feed"
	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Server is a running kvroute instance.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	picker  *picker.Picker
	server  *extproc.Server
	// requests keeps the recent decisions for /debug/requests; nil when
	// RequestLogSize is 0.
	requests *requestLog
	index    *kvindex.Index
	approx   *kvindex.Approx
	toks     *tokenizer.Registry
	src      *source // the worker source (discovery.go)
	fleet    *roster
	events   *kvevents.Core // nil without KV events
	// loadReports feeds the pool; nil unless load comes over NATS.
	loadReports *bus.LoadReports
	feeds       *feed.Feeds // nil unless engines are followed directly
	durable     *durable    // nil unless --durable-events

	natsSrv *natsserver.Server
	// storeLock keeps another process off the embedded server's JetStream
	// store (--durable-events without --nats-url).
	storeLock *storeLock
	nc        *nats.Conn
	etcd      *clientv3.Client

	grpcLis, httpLis, adminLis net.Listener
	httpSrv, adminSrv          *http.Server
	renderLis                  net.Listener // nil unless --render-addr
	renderSrv                  *http.Server

	xds        *envoy.XDSServer // nil unless cfg.XDSAddr
	xdsLis     net.Listener
	xdsChanged chan struct{}

	ctx    context.Context // lives until shutdown begins
	cancel context.CancelFunc
	wg     sync.WaitGroup

	sched     atomic.Pointer[scoring.Scheduler] // set once in Start; atomic for early metric scrapes
	schedDone []<-chan struct{}                 // the scheduler's background work

	deps dependencies // degraded.go
	// natsLate is set while NATS, unreachable at start, has not connected
	// yet; its first connect asks every worker to resync.
	natsLate atomic.Bool

	draining atomic.Bool
	synced   atomic.Bool // the first discovery pass was applied
	// stateChanged wakes the fleet state writer (server/state.go); nil
	// when no state is kept.
	stateChanged chan struct{}
	grpcUp       atomic.Bool // the ext_proc listener is bound and served
	done         chan struct{}
	errOnce      sync.Once
	err          error
}

// Run starts a router and blocks until ctx ends and it has shut down.
func Run(ctx context.Context, cfg Config) error {
	r, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	return r.Wait()
}

// Start brings a router up: tokenizers loaded, NATS connected (or
// embedded), the first discovery pass applied, listeners bound. It returns
// once the router serves; it shuts down when ctx ends (see Wait).
func Start(ctx context.Context, cfg Config) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.RouterID == "" {
		cfg.RouterID = defaultRouterID()
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 15 * time.Second
	}
	r := &Server{cfg: cfg, log: cfg.Logger, done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			r.teardown()
		}
	}()

	start := time.Now()
	if r.toks, err = picker.NewTokenizerRegistry(cfg.Tokenizers, tokenizer.ChatOptions{}); err != nil {
		return nil, err
	}
	// Readiness promises loaded tokenizers; a bad folder stops the start.
	if err = picker.Preload(r.toks); err != nil {
		return nil, err
	}
	if models := r.toks.Models(); len(models) > 0 {
		r.log.Info("tokenizers loaded", "models", models, "took", time.Since(start).Round(time.Millisecond))
	} else {
		r.log.Warn("no tokenizers (--tokenizer MODEL=DIR): every request is routed by load alone")
	}
	r.index = kvindex.New(kvindex.Config{JumpSearch: cfg.IndexJumpSearch})
	r.approx = kvindex.NewApprox(kvindex.ApproxConfig{})
	r.metrics = newMetrics(cfg.Registry, r)
	sched, err := r.newScheduler()
	if err != nil {
		return nil, err
	}
	r.sched.Store(sched)
	if r.src, err = r.openSource(); err != nil {
		return nil, err
	}
	r.fleet = &roster{blockSize: cfg.BlockSize, log: r.log, records: map[string]fleet.Worker{},
		listeners: []fleet.Sink{poolListener{sched.Pool(), r.log}, xdsListener{r}},
		kept:      []fleet.Sink{indexListener{r.index, !cfg.IndexGrowTables}, approxListener{r.approx}}, flapGrace: r.src.FlapGrace()}
	r.fleet.learned = r.metrics.EngineBlockSize
	r.fleet.restarted = func(id string) {
		if r.index.HasWorker(id) {
			r.index.MarkStale(id)
		}
	}
	if r.stateFile() != "" {
		r.stateChanged = make(chan struct{}, 1)
		r.fleet.listeners = append(r.fleet.listeners, stateListener{r})
	}
	var hold chan struct{} // a warm start holds the live tail until the snapshot is in
	if cfg.Recovery.WarmFrom != "" {
		hold = make(chan struct{})
	}
	r.events = r.newEventCore(hold)
	if r.feeds, err = r.newEngineFeeds(hold); err != nil {
		return nil, err
	} else if r.feeds != nil {
		r.fleet.listeners = append(r.fleet.listeners, r.feeds)
	}

	if err = r.connectNATS(); err != nil {
		return nil, err
	}
	if err = r.startScheduler(sched); err != nil {
		return nil, err
	}

	r.requests = newRequestLog(cfg.RequestLogSize, nil)
	r.picker, err = picker.New(picker.Config{
		Scheduler: sched, Index: r.index, Approx: r.approx, Tokenizers: r.toks,
		BlockSize: cfg.BlockSize, Fallbacks: cfg.Fallbacks, OnBadBody: cfg.OnBadBody,
		ModelHeader: cfg.ModelHeader, Metrics: r.metrics, Logger: r.log,
		Multimodal:  cfg.Multimodal,
		MaxMessages: cfg.MaxMessages, MaxPromptBytes: cfg.MaxPromptBytes, MaxConcurrent: cfg.MaxConcurrentDecisions,
		Explain: r.requests != nil,
	})
	if err != nil {
		return nil, err
	}
	if err = r.startEvents(); err != nil {
		return nil, err
	}
	if r.eventsOverNATS() && cfg.Recovery.ResyncInterval > 0 && hold == nil && !cfg.Recovery.DurableEvents {
		// A cold start: the index is empty, every engine can replay.
		r.fleet.listeners = append(r.fleet.listeners, &coldResync{r: r, asked: map[string]bool{}})
	}
	r.restoreFleet() // before xDS: its first snapshot holds the restored workers
	if r.stateChanged != nil {
		r.goRun(func() error { r.writeStates(); return nil })
	}
	if cfg.XDSAddr != "" {
		if err = r.startXDS(); err != nil {
			return nil, err
		}
	}
	r.startDiscovery()
	if hold != nil {
		r.warmStart(hold) // after discovery: the snapshot loads known workers only
	}
	if r.durable != nil {
		if err = r.durableRecover(); err != nil { // after discovery, as the warm start
			return nil, err
		}
		r.goRun(func() error { r.runSnapshots(); return nil })
	}
	if r.eventsOverNATS() && r.loadReports != nil {
		// Now that the core applies live batches: a quiet worker's lost
		// batch shows in its next load report. Only over NATS: a report
		// counts the publisher's NATS numbering, not an engine's.
		r.loadReports.FollowEvents(r.events)
	}
	if r.eventsOverNATS() && cfg.Recovery.ResyncInterval > 0 { // resync asks over NATS; ZMQ feeds replay by themselves
		r.goRun(func() error { r.runResync(); return nil })
	}

	stream := cfg.Stream
	if r.requests != nil {
		stream.Requests = r.requests
	}
	r.server, err = extproc.NewServer(extproc.ServerConfig{Stream: stream, Decider: r.picker, Metrics: r.metrics, TLS: cfg.TLS, Logger: r.log, KeepaliveMinTime: cfg.KeepaliveMinTime,
		MaxStreams: cfg.MaxStreams, StreamIdleTimeout: cmp.Or(cfg.StreamIdleTimeout, -1), // 0: off
		ConnIdleTimeout: cmp.Or(cfg.ConnIdleTimeout, -1), ForwardObservation: r.forwardObservation()})
	if err != nil {
		return nil, err
	}
	if err = r.receiveObservations(); err != nil {
		return nil, err
	}
	if r.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("ext_proc listen: %w", err)
	}
	if r.httpLis, r.httpSrv, err = r.serveHTTP("http", cfg.HTTPAddr, r.httpHandler()); err != nil {
		return nil, err
	}
	if r.adminLis, r.adminSrv, err = r.serveHTTP("admin", cfg.AdminAddr, r.adminHandler()); err != nil {
		return nil, err
	}
	if r.renderLis, r.renderSrv, err = r.serveHTTP("render", cfg.RenderAddr, r.renderHandler()); err != nil {
		return nil, err
	}
	r.grpcUp.Store(true) // bound: connections queue until Serve accepts them
	r.goRun(func() error { return r.server.Serve(r.grpcLis) })
	r.goRun(func() error { r.watchReadiness(); return nil })
	go r.shutdownOn(ctx)
	r.log.Info("kvroute config", "config", cfg) // secrets redacted by Config.LogValue
	r.log.Info("kvroute serving", "grpc", r.GRPCAddr(), "http", r.HTTPAddr(), "admin", r.AdminAddr(), "render", r.RenderAddr(), "admin_token", r.cfg.AdminToken != "", "nats", redactURL(r.NATSURL()),
		"mode", sched.Mode().Name(), "namespace", cfg.Namespace, "tokenizers", r.toks.Models())
	return r, nil
}

// defaultRouterID is the pod name ($POD_NAME), else the host name: stable
// across restarts, so a restarted replica's reset clears the load its
// earlier run left on its peers. Several replicas on one host need their
// own --router-id (replica sync logs an error when two share one).
func defaultRouterID() string {
	if id := os.Getenv("POD_NAME"); id != "" {
		return id
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		return host
	}
	return "kvroute-" + strconv.Itoa(os.Getpid())
}

// HTTP server timeouts: a client that trickles its headers or body, or
// keeps an idle connection, cannot hold a goroutine and a socket for long.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpReadTimeout       = 30 * time.Second // /debug/explain bodies up to the body limit
	httpWriteTimeout      = 60 * time.Second
	httpIdleTimeout       = 120 * time.Second
)

// serveHTTP binds addr and serves h there until shutdown; "-" or ""
// serves nothing (nil listener and server).
func (r *Server) serveHTTP(name, addr string, h http.Handler) (net.Listener, *http.Server, error) {
	if addr == "-" || addr == "" {
		return nil, nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s listen: %w", name, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout}
	r.goRun(func() error {
		err := srv.Serve(lis)
		if r.ctx.Err() != nil && errors.Is(err, net.ErrClosed) {
			return nil // our own listener, closed by shutdown
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
	return lis, srv, nil
}

// goRun runs fn until it returns; an error ends the router.
func (r *Server) goRun(fn func() error) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := fn(); err != nil {
			r.fail(err)
		}
	}()
}

func (r *Server) fail(err error) {
	r.errOnce.Do(func() { r.err = err })
	r.log.Error("router component failed; shutting down", "err", err)
	r.cancel()
}

func (r *Server) connectNATS() error {
	if !r.cfg.needsNATS() {
		r.log.Info("no NATS: KV events and load come straight from the engines and replica sync is off")
		return nil
	}
	url := r.cfg.NATSURL
	if url == "" {
		host, portStr, err := net.SplitHostPort(r.cfg.EmbeddedNATSAddr)
		if err != nil {
			return fmt.Errorf("embedded nats address %q: %w", r.cfg.EmbeddedNATSAddr, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return fmt.Errorf("embedded nats port %q: %w", portStr, err)
		}
		if port == 0 {
			port = natsserver.RANDOM_PORT
		}
		nopts := &natsserver.Options{Host: host, Port: port, NoLog: true, NoSigs: true, MaxPayload: 8 << 20}
		if r.cfg.Recovery.DurableEvents {
			nopts.JetStream, nopts.StoreDir = true, cmp.Or(r.cfg.Recovery.JetStreamDir, defaultJetStreamDir(port))
			if r.storeLock, err = lockStoreDir(nopts.StoreDir); err != nil {
				return err
			}
		}
		srv, err := natsserver.NewServer(nopts)
		if err != nil {
			return fmt.Errorf("embedded nats: %w", err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			srv.Shutdown()
			return fmt.Errorf("embedded nats on %s not ready", r.cfg.EmbeddedNATSAddr)
		}
		r.natsSrv, url = srv, srv.ClientURL()
	}
	opts := []nats.Option{nats.Name("kvroute " + r.cfg.RouterID), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if r.natsSrv == nil {
		auth, err := r.cfg.natsAuth()
		if err != nil {
			return err
		}
		opts = append(opts, auth...)
	}
	opts = append(opts,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: our own Close
				r.dependencyDown(depNATS, err)
			}
		}),
		// A first connect retried after a failed start is reported through
		// ConnectHandler, every later one through ReconnectHandler.
		nats.ConnectHandler(r.natsConnected), nats.ReconnectHandler(r.natsConnected))
	start := time.Now()
	nc, err := nats.Connect(url, opts...)
	if err != nil && unreachable(err) && r.natsSrv == nil {
		if r.cfg.Recovery.DurableEvents {
			return fmt.Errorf("nats connect %s: %w (--durable-events recovers the index from the NATS stream before it serves, so NATS must be reachable at start)", redactURL(url), err)
		}
		// Start degraded rather than exit: a router restarted during a NATS
		// outage would otherwise crash-loop while its running peers route.
		r.natsLate.Store(true)
		r.dependencyDown(depNATS, err)
		nc, err = nats.Connect(url, append(opts, nats.RetryOnFailedConnect(true))...)
	}
	if err != nil {
		return fmt.Errorf("nats connect %s: %w", redactURL(url), err)
	}
	r.nc = nc
	if !nc.IsConnected() {
		r.log.Warn("nats unreachable at start; serving without it and connecting in the background", "url", redactURL(url))
		return nil
	}
	r.natsLate.Store(false)
	r.dependencyUp(depNATS)
	r.log.Info("nats connected", "url", redactURL(nc.ConnectedUrl()), "embedded", r.natsSrv != nil, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// natsConnected runs on nats.go's callback goroutine each time the
// connection comes (back) up.
func (r *Server) natsConnected(c *nats.Conn) {
	r.log.Info("nats connected", "url", redactURL(c.ConnectedUrl()))
	r.dependencyUp(depNATS)
	if r.natsLate.CompareAndSwap(true, false) {
		r.resyncAfterLateNATS()
	}
}

// resyncAfterLateNATS runs when NATS connects for the first time after
// the router started without it: every batch the workers published before
// is missing from the index, so each known worker is marked stale (no
// overlap credit) and asked to resync, as after an outage.
func (r *Server) resyncAfterLateNATS() {
	if !r.cfg.KVEvents || r.cfg.EngineEvents == EngineEventsZMQ {
		return // the index does not come from NATS
	}
	n := 0
	for _, w := range r.fleet.snapshot() {
		if r.index.HasWorker(w.ID) {
			r.index.MarkStale(w.ID)
			n++
		}
	}
	r.log.Info("nats arrived after the start: workers marked stale until they resync their KV events", "workers", n)
}

// watchReadiness keeps the health status in step with Ready.
func (r *Server) watchReadiness() {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if ready := r.Ready(); ready != r.server.Ready() {
			r.server.SetReady(ready)
			r.log.Info("readiness changed", "ready", ready)
		}
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Ready reports whether the router can route: tokenizers loaded (Start
// did), discovery synced with at least one worker, and the ext_proc server
// up. A NATS outage is not a readiness failure: routing goes on by load and
// the index it has (see Degraded); failing readiness would take every
// replica out of a fail-closed Envoy at once.
func (r *Server) Ready() bool { return r.NotReadyReason() == "" }

// NotReadyReason says why Ready is false ("" when it is true).
func (r *Server) NotReadyReason() string {
	switch {
	case r.draining.Load() || r.ctx.Err() != nil:
		return "shutting down"
	case !r.synced.Load() && !r.fleet.servingRestored():
		return "worker discovery not synced"
	case r.fleet.len() == 0:
		return "no workers discovered"
	case !r.grpcUp.Load():
		return "ext_proc server not up"
	}
	return ""
}

func (r *Server) shutdownOn(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-r.ctx.Done():
	}
	r.draining.Store(true)
	r.server.SetReady(false)
	r.log.Info("shutting down: readiness off, draining ext_proc streams", "drain_delay", r.cfg.DrainDelay, "grace", r.cfg.ShutdownGrace)
	if r.cfg.DrainDelay > 0 {
		// Keep routing while health checkers and load balancers notice
		// NOT_SERVING, so no new stream meets a closed listener.
		select {
		case <-time.After(r.cfg.DrainDelay):
		case <-r.ctx.Done():
		}
	}
	gctx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownGrace)
	defer cancel()
	r.server.Shutdown(gctx) // NOT_SERVING, GracefulStop, then Stop at the deadline
	for _, hs := range []*http.Server{r.httpSrv, r.adminSrv, r.renderSrv} {
		if hs != nil {
			_ = hs.Shutdown(gctx)
		}
	}
	r.finalSnapshot()
	r.teardown()
	r.wg.Wait()
	r.log.Info("kvroute stopped")
	close(r.done)
}

// teardown stops background work and closes connections.
func (r *Server) teardown() {
	r.cancel()
	if r.fleet != nil {
		r.fleet.stop()
	}
	r.stopScheduler()
	if r.feeds != nil {
		r.feeds.Close()
	}
	if r.etcd != nil {
		_ = r.etcd.Close()
	}
	if r.nc != nil {
		r.nc.Close()
	}
	if r.natsSrv != nil {
		r.natsSrv.Shutdown()
		r.natsSrv.WaitForShutdown()
	}
	r.storeLock.release()
	for _, l := range []net.Listener{r.grpcLis, r.httpLis, r.adminLis, r.renderLis, r.xdsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// Wait blocks until the router has shut down and returns the error that
// ended it, if any.
func (r *Server) Wait() error {
	<-r.done
	return r.err
}

// Shutdown ends the router as ctx cancellation would and waits for it.
func (r *Server) Shutdown() error {
	r.cancel()
	return r.Wait()
}

// GRPCAddr is the bound ext_proc address.
func (r *Server) GRPCAddr() string { return r.grpcLis.Addr().String() }

// HTTPAddr is the bound HTTP address, or "" when disabled.
func (r *Server) HTTPAddr() string {
	if r.httpLis == nil {
		return ""
	}
	return r.httpLis.Addr().String()
}

// AdminAddr is the bound admin address (/debug/*, /admin/*), or "" when
// disabled.
func (r *Server) AdminAddr() string {
	if r.adminLis == nil {
		return ""
	}
	return r.adminLis.Addr().String()
}

// NATSURL is the NATS server in use (the embedded one's when embedded), or
// "" when the router runs without NATS.
func (r *Server) NATSURL() string {
	if r.nc == nil {
		return ""
	}
	return r.nc.ConnectedUrl()
}

// Picker exposes the decision path (Explain, the scoring router).
func (r *Server) Picker() *picker.Picker { return r.picker }

// Index exposes the KV-event index.
func (r *Server) Index() *kvindex.Index { return r.index }

// Mode returns the current router mode's name.
func (r *Server) Mode() string { return r.sched.Load().Mode().Name() }
