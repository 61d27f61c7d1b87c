package extproc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ServiceName is the ext_proc gRPC service, also a health-check service name.
const ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"

// Metrics receives the stream-level counts. Implementations must be safe
// for concurrent use.
type Metrics interface {
	// StreamStarted counts a new ext_proc stream.
	StreamStarted()
	// StreamEnded counts an ended stream by its gRPC code (OK for clean ends).
	StreamEnded(code codes.Code)
	// Rejected counts an immediate response by HTTP status.
	Rejected(status int)
	// StreamIdle counts a stream closed by the stream idle timeout.
	StreamIdle()
}

type nopMetrics struct{}

var _ Metrics = nopMetrics{}

func (nopMetrics) StreamStarted()         {}
func (nopMetrics) StreamEnded(codes.Code) {}
func (nopMetrics) Rejected(int)           {}
func (nopMetrics) StreamIdle()            {}

// ServerConfig configures the gRPC edge.
type ServerConfig struct {
	// Stream shapes each stream's answers.
	Stream Config
	// Decider chooses workers. Required.
	Decider Decider
	// Metrics may be nil.
	Metrics Metrics
	// TLS, when set, serves TLS (and mTLS when it verifies client certs).
	TLS *tls.Config
	// Logger may be nil (slog.Default()).
	Logger *slog.Logger
	// KeepaliveMinTime is the shortest interval between client pings the
	// server tolerates, with or without open streams (default 1 s, well under
	// the intervals Envoy's connection_keepalive is set to in practice).
	KeepaliveMinTime time.Duration
	// MaxStreams caps concurrent streams per HTTP/2 connection
	// (grpc.MaxConcurrentStreams; default 4096). Envoy sends each HTTP
	// request on its own stream, so this must exceed the requests one
	// Envoy connection carries at once.
	MaxStreams uint32
	// StreamIdleTimeout closes a stream on which Envoy sent nothing for
	// this long (default 5 min: above a slow prefill's wait for the first
	// response byte). A new stream must send its first message within
	// min(StreamIdleTimeout, 10 s). Negative disables both. It does not
	// apply once a stream awaits only its end (Stream.AwaitsEnd).
	StreamIdleTimeout time.Duration
	// ConnIdleTimeout closes a connection with no open stream for this
	// long (keepalive pings do not count; the client reconnects when it
	// next has a request); one that has not finished the HTTP/2 (and TLS)
	// handshake is closed after min(ConnIdleTimeout, 10 s). Default 2 min,
	// the HTTP listener's idle timeout; negative disables both.
	ConnIdleTimeout time.Duration
	// ObserveGrace is how long a routing stream whose response is observed
	// by a second filter (ObservedMetadataKey) waits, once Envoy closed it,
	// for that filter's report of the response headers before it frees the
	// request's load as a normal end (default DefaultObserveGrace; negative
	// waits not at all).
	ObserveGrace time.Duration
	// ForwardObservation, when set, receives each observing filter's
	// report that matches no routing stream of this server, encoded for
	// ObservePeer: with several replicas behind one Envoy cluster the
	// report may have reached another replica than the one that routed the
	// request, and the caller hands it to its peers (kvroute: over NATS).
	// It must not block.
	ForwardObservation func(report []byte)
}

// DefaultConnIdleTimeout is ServerConfig.ConnIdleTimeout's default.
const DefaultConnIdleTimeout = 2 * time.Minute

// handshakeTimeout caps the time a new connection has to send the HTTP/2
// preface (and finish TLS), as the HTTP listener's header timeout does.
const handshakeTimeout = 10 * time.Second

// firstMessageTimeout bounds the wait for a new stream's request headers,
// which Envoy sends as it opens the stream.
const firstMessageTimeout = 10 * time.Second

// Server is the ext_proc gRPC server with the standard health service.
// Health answers for "" and ServiceName (ready or not), "liveness"
// (always serving while up) and "readiness" (same as ServiceName).
type Server struct {
	cfg     ServerConfig
	grpc    *grpc.Server
	health  *health.Server
	metrics Metrics
	log     *slog.Logger
	ready   atomic.Bool
	// stopping is set when Shutdown begins: a listener closed after that
	// is the shutdown, not a serve failure.
	stopping atomic.Bool
	// failLog rate-limits the per-stream failure line (loglimit.go).
	failLog logLimiter
	// observed matches observing streams to routing streams.
	observed *observers
}

var _ pb.ExternalProcessorServer = (*Server)(nil)

// NewServer builds the gRPC server. It starts NOT_SERVING; call SetReady
// when the router can route.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Decider == nil {
		return nil, errors.New("extproc: ServerConfig.Decider is required")
	}
	s := &Server{cfg: cfg, metrics: cfg.Metrics, log: cfg.Logger, health: health.NewServer(), failLog: logLimiter{every: failLogEvery}}
	if s.metrics == nil {
		s.metrics = nopMetrics{}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.cfg.Stream.Logger = s.log
	if s.cfg.KeepaliveMinTime <= 0 {
		s.cfg.KeepaliveMinTime = time.Second
	}
	if s.cfg.MaxStreams == 0 {
		s.cfg.MaxStreams = 4096
	}
	if s.cfg.StreamIdleTimeout == 0 {
		s.cfg.StreamIdleTimeout = 5 * time.Minute
	}
	if s.cfg.ConnIdleTimeout == 0 {
		s.cfg.ConnIdleTimeout = DefaultConnIdleTimeout
	}
	if s.cfg.ObserveGrace == 0 {
		s.cfg.ObserveGrace = DefaultObserveGrace
	}
	s.observed = newObservers(s.cfg.ObserveGrace)
	params := keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}
	opts := []grpc.ServerOption{
		// The body arrives in one message in BUFFERED mode; leave room for
		// headers and metadata around it.
		grpc.MaxRecvMsgSize(s.cfg.Stream.maxBody() + 1<<20),
		// Envoy's HTTP/2 keepalive (connection_keepalive) commonly pings
		// every few seconds with no stream open; gRPC's default policy
		// (5 min, no pings without streams) would answer with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.cfg.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(s.cfg.MaxStreams),
	}
	if idle := s.cfg.ConnIdleTimeout; idle > 0 {
		// Without these a connection that never opens a stream (or never
		// says a word) holds a socket and goroutines for as long as the
		// client likes.
		params.MaxConnectionIdle = idle
		opts = append(opts, grpc.ConnectionTimeout(min(idle, handshakeTimeout)))
	}
	opts = append(opts, grpc.KeepaliveParams(params))
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	pb.RegisterExternalProcessorServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus("liveness", healthpb.HealthCheckResponse_SERVING)
	s.SetReady(false)
	return s, nil
}

// SetReady flips the readiness health status ("", ServiceName, "readiness").
func (s *Server) SetReady(ready bool) {
	s.ready.Store(ready)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", ServiceName, "readiness"} {
		s.health.SetServingStatus(name, st)
	}
}

// Ready reports the last SetReady value.
func (s *Server) Ready() bool { return s.ready.Load() }

// GRPC exposes the underlying server, to register more services.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// Serve accepts connections on lis until Shutdown.
func (s *Server) Serve(lis net.Listener) error {
	err := s.grpc.Serve(lis)
	if s.stopping.Load() && errors.Is(err, net.ErrClosed) {
		return nil
	}
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("extproc: serve: %w", err)
	}
	return nil
}

// Shutdown turns every health status NOT_SERVING, lets open streams finish
// until ctx ends, then stops hard.
func (s *Server) Shutdown(ctx context.Context) {
	s.stopping.Store(true)
	s.ready.Store(false)
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// Process implements the ext_proc service: one Stream per gRPC stream.
func (s *Server) Process(srv grpc.BidiStreamingServer[pb.ProcessingRequest, pb.ProcessingResponse]) (err error) {
	ctx := srv.Context()
	st := NewStream(&s.cfg.Stream, s.cfg.Decider)
	if md, ok := metadata.FromIncomingContext(ctx); ok && slices.Contains(md.Get(ObservedMetadataKey), ObservedMetadataValue) {
		st.SetResponseObserved()
	}
	s.metrics.StreamStarted()
	xm, _ := s.metrics.(ExchangeMetrics)
	waited, observer := 0, false
	var ended error
	// reg is the stream's entry among the observed streams once it has
	// routed; from then on every call into st goes through reg.mu.
	var reg *observedStream
	// locked runs f on st, under reg.mu once the stream is registered.
	locked := func(f func()) {
		if reg != nil {
			reg.mu.Lock()
			defer reg.mu.Unlock()
		}
		f()
	}
	defer func() {
		var done bool
		var phase string
		locked(func() { done, phase = st.Done(), st.Phase() })
		if reg != nil {
			s.observed.end(reg, ended)
		} else {
			st.Close(ended)
		}
		if xm != nil && !observer {
			xm.StreamExchanges(waited)
		}
		code := status.Code(err)
		if code == codes.Canceled {
			// Envoy resets the ext_proc stream once the HTTP exchange is
			// over, or once the client has gone, rather than half-closing
			// it: a normal end (a request cut short is counted where its
			// load is freed, as outcome reset).
			code = codes.OK
			if done {
				err = nil
			}
		}
		s.metrics.StreamEnded(code)
		if code := status.Code(err); code != codes.OK && code != codes.Canceled {
			if ok, held := s.failLog.allow(time.Now()); ok {
				s.log.Warn("ext_proc stream failed", "phase", phase, "err", err, "similar_lines_left_out", held)
			}
		}
	}()
	// After the response headers with response body NONE, nothing comes
	// until Envoy closes the stream at the request's end: silence then is
	// no sign of a dead peer, and the idle timeout does not apply.
	recv := func(bool) (*pb.ProcessingRequest, error) { return srv.Recv() }
	if s.cfg.StreamIdleTimeout > 0 {
		var stop func()
		recv, stop = idleRecv(ctx, srv.Recv, s.cfg.StreamIdleTimeout)
		defer stop()
	}
	for {
		var awaits bool
		locked(func() { awaits = st.AwaitsEnd() })
		m, rerr := recv(awaits)
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if errors.Is(rerr, errStreamIdle) {
			ended = rerr
			s.metrics.StreamIdle()
			return status.Error(codes.DeadlineExceeded, rerr.Error())
		}
		if rerr != nil {
			ended = rerr
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return rerr
		}
		if xm != nil {
			blocking := !m.GetObservabilityMode()
			if blocking {
				waited++
			}
			xm.Exchange(exchangePhase(m), blocking)
		}
		if m.GetObservabilityMode() && (observer || waited == 0) {
			// The observing filter's stream: its report goes to the
			// routing stream it is about. Its response headers are all it
			// carries, so it ends there, without waiting for Envoy's
			// deferred close.
			observer = true
			if m.GetResponseHeaders() != nil {
				matched := s.observed.observe(m)
				if om, ok := s.metrics.(ObserveMetrics); ok {
					om.Observation(matched)
				}
				if !matched && s.cfg.ForwardObservation != nil {
					if b, err := encodeObservation(m); err == nil {
						s.cfg.ForwardObservation(b)
					}
				}
				return nil
			}
			continue
		}
		var out []*pb.ProcessingResponse
		var serr error
		if reg != nil {
			locked(func() { out, serr = st.Step(ctx, m) })
		} else {
			out, serr = st.Step(ctx, m)
			if st.Observed() && st.routed && serr == nil {
				reg = s.observed.register(st.req.Headers[RequestIDHeader], st)
			}
		}
		if serr != nil {
			ended = serr
			return serr
		}
		for _, r := range out {
			if _, ok := r.Response.(*pb.ProcessingResponse_ImmediateResponse); ok {
				var code int
				locked(func() { code = st.Status() })
				s.metrics.Rejected(code)
			}
			if werr := srv.Send(r); werr != nil {
				ended = werr
				return werr
			}
		}
	}
}

// errStreamIdle ends a stream on which Envoy sent nothing for too long.
var errStreamIdle = errors.New("ext_proc stream idle: nothing received within the stream idle timeout")

type recvResult struct {
	m   *pb.ProcessingRequest
	err error
}

// idleRecv wraps a stream's Recv so that a wait longer than idle (or, for
// the first message, min(idle, firstMessageTimeout)) fails with
// errStreamIdle. One goroutine per stream receives; it ends when the
// stream does (its Recv fails once the handler has returned) or when stop
// is called and the handler is gone.
func idleRecv(ctx context.Context, recv func() (*pb.ProcessingRequest, error), idle time.Duration) (func(untimed bool) (*pb.ProcessingRequest, error), func()) {
	ch := make(chan recvResult)
	done := make(chan struct{})
	go func() {
		for {
			m, err := recv()
			select {
			case ch <- recvResult{m, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(min(idle, firstMessageTimeout))
	first := true
	never := make(<-chan time.Time)
	next := func(untimed bool) (*pb.ProcessingRequest, error) {
		expired := timer.C
		switch {
		case untimed:
			timer.Stop()
			expired = never
		case !first:
			timer.Reset(idle)
		}
		first = false
		select {
		case r := <-ch:
			timer.Stop()
			return r.m, r.err
		case <-expired:
			return nil, errStreamIdle
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
	}
	return next, func() { close(done); timer.Stop() }
}

// LoadTLS builds a server TLS config from PEM files. With clientCA set,
// clients must present a certificate signed by it (mTLS).
func LoadTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("extproc: load TLS key pair: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("extproc: read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("extproc: client CA %s holds no PEM certificate", clientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
