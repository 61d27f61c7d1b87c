package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/fleet"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// FleetConfig configures StartFleet.
type FleetConfig struct {
	// Workers is the number of workers (default 1).
	Workers int
	// IDPrefix names workers IDPrefix0, IDPrefix1, ... (default "w").
	IDPrefix string
	// Host is the listen host (default 127.0.0.1). BasePort, when non-zero,
	// gives worker i port BasePort+i; zero picks free ports.
	Host     string
	BasePort int
	// AdvertiseHost, when set, replaces Host in the workers' records.
	AdvertiseHost string
	// Worker is the template for every worker; ID, ListenAddr,
	// AdvertiseAddr and Seed are set per worker. Its NATS and Etcd fields
	// take precedence over NATSURL and EtcdEndpoints.
	Worker WorkerConfig
	// NATSURL, when set and Worker.NATS is nil, is dialled for events and
	// load reports.
	NATSURL string
	// EtcdEndpoints, when set and Worker.Etcd is nil, are used for
	// registration.
	EtcdEndpoints []string
	// ZMQBasePort, when non-zero, publishes worker i's events as vLLM does
	// on tcp://Host:ZMQBasePort+2i with replay on the next port.
	ZMQBasePort int
	// AdminAddr, when set, serves the fault switches there (see
	// AdminHandler).
	AdminAddr string
}

// Fleet is a set of workers in one process.
type Fleet struct {
	// mu guards workers and byID while StartFleet fills them; afterwards
	// they never change.
	mu      sync.Mutex
	workers []*Worker
	byID    map[string]*Worker
	nc      *nats.Conn
	natsURL string
	etcd    *clientv3.Client
	admin   *adminServer
	log     *slog.Logger
}

// StartFleet starts cfg.Workers workers and, if configured, the admin
// server. On error nothing is left running.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.IDPrefix == "" {
		cfg.IDPrefix = "w"
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	log := cfg.Worker.Logger
	if log == nil {
		log = slog.Default()
	}
	f := &Fleet{byID: make(map[string]*Worker), log: log}
	tmpl := cfg.Worker
	if tmpl.NATS == nil && cfg.NATSURL != "" {
		// Batches in flight when the connection broke are lost, and the
		// router's view of each worker goes stale at the gap; re-announcing
		// every cache after a reconnect heals it.
		nc, err := nats.Connect(cfg.NATSURL, nats.Name("kvsim"), nats.MaxReconnects(-1),
			nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true),
			nats.ReconnectHandler(func(*nats.Conn) {
				log.Info("NATS reconnected; re-announcing every worker's KV cache")
				f.mu.Lock()
				ws := slices.Clone(f.workers)
				f.mu.Unlock()
				for _, w := range ws {
					w.Resync()
				}
			}))
		if err != nil {
			return nil, fmt.Errorf("start fleet: connect to NATS %s: %w", cfg.NATSURL, err)
		}
		f.nc, f.natsURL, tmpl.NATS = nc, cfg.NATSURL, nc
	}
	if tmpl.Etcd == nil && len(cfg.EtcdEndpoints) > 0 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.EtcdEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			f.closeClients()
			return nil, fmt.Errorf("start fleet: etcd client: %w", err)
		}
		f.etcd, tmpl.Etcd = cli, cli
	}
	for i := range cfg.Workers {
		wc := tmpl
		wc.ID = cfg.IDPrefix + strconv.Itoa(i)
		port := 0
		if cfg.BasePort != 0 {
			port = cfg.BasePort + i
		}
		wc.ListenAddr = net.JoinHostPort(cfg.Host, strconv.Itoa(port))
		if cfg.AdvertiseHost != "" && port != 0 {
			wc.AdvertiseAddr = net.JoinHostPort(cfg.AdvertiseHost, strconv.Itoa(port))
		}
		wc.Seed = tmpl.Seed + uint64(i)
		if cfg.ZMQBasePort != 0 {
			wc.ZMQEndpoint = fmt.Sprintf("tcp://%s:%d", cfg.Host, cfg.ZMQBasePort+2*i)
			wc.ZMQReplayEndpoint = fmt.Sprintf("tcp://%s:%d", cfg.Host, cfg.ZMQBasePort+2*i+1)
		}
		w, err := StartWorker(ctx, wc)
		if err != nil {
			_ = f.Close(context.Background())
			return nil, fmt.Errorf("start fleet: %w", err)
		}
		f.mu.Lock()
		f.workers = append(f.workers, w)
		f.byID[w.ID()] = w
		f.mu.Unlock()
	}
	if cfg.AdminAddr != "" {
		a, err := startAdmin(cfg.AdminAddr, f)
		if err != nil {
			_ = f.Close(context.Background())
			return nil, fmt.Errorf("start fleet: %w", err)
		}
		f.admin = a
	}
	return f, nil
}

// Workers returns the fleet's workers in id order.
func (f *Fleet) Workers() []*Worker { return f.workers }

// Worker returns the worker with id, or nil.
func (f *Fleet) Worker(id string) *Worker { return f.byID[id] }

// Records returns every worker's discovery record, e.g. for a static
// workers file.
func (f *Fleet) Records() []fleet.Worker {
	recs := make([]fleet.Worker, len(f.workers))
	for i, w := range f.workers {
		recs[i] = w.Record()
	}
	return recs
}

// AdminAddr returns the admin server's address, or "" without one.
func (f *Fleet) AdminAddr() string {
	if f.admin == nil {
		return ""
	}
	return f.admin.ln.Addr().String()
}

// Close stops every worker cleanly (deregistering them) and the admin
// server, waiting for in-flight requests until ctx ends.
func (f *Fleet) Close(ctx context.Context) error {
	var errs []error
	if f.admin != nil {
		errs = append(errs, f.admin.close())
	}
	werrs := make([]error, len(f.workers))
	var wg sync.WaitGroup
	for i, w := range f.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			werrs[i] = w.Close(ctx)
		}()
	}
	wg.Wait()
	errs = append(errs, werrs...)
	f.closeClients()
	return errors.Join(errs...)
}

func (f *Fleet) closeClients() {
	if f.nc != nil {
		_ = f.nc.Drain()
	}
	if f.etcd != nil {
		_ = f.etcd.Close()
	}
}
