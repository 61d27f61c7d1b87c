package envoytest

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvroute/kvroute/envoy"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// GatewayOptions adapts a bootstrap to the machine the Gateway runs on.
type GatewayOptions struct {
	// ListenAddress replaces the listener's address, e.g. "127.0.0.1:0".
	ListenAddress string
	// Endpoints replaces the endpoints ("host:port") of named clusters, so
	// the fixed ports of a shipped bootstrap can point at test servers. It
	// includes the ext_proc cluster ("kvroute"), whose first endpoint is the
	// one the Gateway dials. For a bootstrap with CDS over
	// ADS (xds.yaml), clusters it does not define are added: the Gateway does
	// not speak xDS, so the test or demo supplies what kvroute would serve.
	Endpoints map[string][]string
	// Clusters are clusters as kvroute's xDS server delivers them
	// (envoy.WorkersCluster), for a bootstrap with CDS over ADS; the
	// Gateway does not speak xDS. Endpoints, when it names one of them,
	// replaces its endpoints.
	Clusters []*clusterv3.Cluster
	// Logger receives one line per failed exchange; nil discards.
	Logger *slog.Logger
	// SubsetHint stands in for the gateway implementation that fills the
	// envoy.lb.subset_hint filter metadata (Gateway API Inference Extension):
	// when the bootstrap forwards that namespace and SubsetHint returns a
	// non-nil list for a request, the list is sent to kvroute in
	// metadata_context as x-gateway-destination-endpoint-subset.
	SubsetHint func(*http.Request) []string
}

// Gateway is a development and test stand-in for Envoy running one of
// kvroute's bootstraps; see the package documentation for what it does and
// does not do. Production uses Envoy.
type Gateway struct {
	cfg        *gatewayConfig
	subsetHint func(*http.Request) []string
	conn       *grpc.ClientConn
	client     extprocsvc.ExternalProcessorClient
	log        *slog.Logger

	streams sync.WaitGroup // deferred closes of finished ext_proc streams

	mu        sync.Mutex
	srv       *http.Server
	ln        net.Listener
	serveDone chan struct{}
	closed    bool
}

// LoadGateway validates a bootstrap (see Validate) and builds a Gateway for it.
func LoadGateway(data []byte, opts GatewayOptions) (*Gateway, error) {
	b, err := envoy.Validate(data)
	if err != nil {
		return nil, err
	}
	return NewGateway(b, opts)
}

// LoadGatewayFile is LoadGateway for a file such as envoy/cluster-header.yaml.
func LoadGatewayFile(path string, opts GatewayOptions) (*Gateway, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("envoy gateway: %w", err)
	}
	return LoadGateway(data, opts)
}

// NewGateway builds a Gateway for a decoded bootstrap. It fails when the
// bootstrap uses anything the Gateway does not implement.
func NewGateway(b *bootstrapv3.Bootstrap, opts GatewayOptions) (*Gateway, error) {
	cfg, err := buildGatewayConfig(b, opts)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(cfg.proc.target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("envoy gateway: ext_proc client for %s: %w", cfg.proc.target, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gateway{cfg: cfg, subsetHint: opts.SubsetHint, conn: conn,
		client: extprocsvc.NewExternalProcessorClient(conn), log: log}, nil
}

// StartGateway renders the bootstrap of a style for the given workers and
// kvroute address, and serves it on a free loopback port until ctx ends or
// Close is called. It is the one-call setup for the all-in-one demo. For the
// xds style the workers become the one cluster kvroute's ADS server would
// send (envoy.WorkersCluster).
func StartGateway(ctx context.Context, style string, workers []envoy.Worker, extProcAddr string) (*Gateway, error) {
	data, err := envoy.Generate(style, workers, envoy.Options{ExtProcAddress: extProcAddr})
	if err != nil {
		return nil, err
	}
	opts := GatewayOptions{ListenAddress: "127.0.0.1:0"}
	if style == envoy.StyleXDS {
		c, err := envoy.WorkersCluster(workers)
		if err != nil {
			return nil, err
		}
		opts.Clusters = []*clusterv3.Cluster{c}
	}
	g, err := LoadGateway(data, opts)
	if err != nil {
		return nil, err
	}
	if err := g.Start(ctx); err != nil {
		_ = g.Close()
		return nil, err
	}
	return g, nil
}

// Start listens on the configured address and serves HTTP/1.1 and h2c
// (HTTP/2 with prior knowledge) in the background until ctx ends or Close.
func (g *Gateway) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.srv != nil {
		return errors.New("envoy gateway: already started or closed")
	}
	ln, err := net.Listen("tcp", g.cfg.listenAddr)
	if err != nil {
		return fmt.Errorf("envoy gateway: listen: %w", err)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	g.srv = &http.Server{Handler: g, Protocols: p, ReadHeaderTimeout: 10 * time.Second}
	g.ln = ln
	g.serveDone = make(chan struct{})
	go func() {
		defer close(g.serveDone)
		if err := g.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.log.Error("envoy gateway: serve", "err", err)
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = g.Close()
		case <-g.serveDone:
		}
	}()
	return nil
}

// Addr is the listener's address once started ("" before).
func (g *Gateway) Addr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln == nil {
		return ""
	}
	return g.ln.Addr().String()
}

// URL is "http://" + Addr().
func (g *Gateway) URL() string { return "http://" + g.Addr() }

// Close stops serving, ends in-flight exchanges, waits for their ext_proc
// streams and closes the connection to kvroute. It is safe to call twice.
func (g *Gateway) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	srv, done := g.srv, g.serveDone
	g.mu.Unlock()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		cancel()
		<-done
	}
	g.streams.Wait()
	for _, c := range g.cfg.clusters {
		c.close()
	}
	return g.conn.Close()
}

// ServeHTTP runs one request through ext_proc and the router. It can be
// mounted on any server (for example httptest) instead of using Start.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	x := &exchange{g: g, pc: &g.cfg.proc, ctx: ctx, w: w, r: r}
	x.run()
}
