// Command kvbridge is the sidecar that brings a stock vLLM or SGLang engine
// into a kvroute fleet: ZMQ KV events to NATS, /metrics to load reports, and
// a leased etcd registration. Run it with --help for the flags.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/bridge"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Hostname, os.Stderr)
	stop()
	os.Exit(cli.Exit("kvbridge", err, os.Stderr))
}

// run is main without the process: flags, connections, the bridge until ctx
// ends (SIGTERM), and an orderly shutdown that deregisters the worker.
func run(ctx context.Context, args []string, getenv func(string) string, hostname func() (string, error), stderr io.Writer) error {
	if len(args) == 1 && args[0] == "version" {
		args = []string{"--version"}
	}
	o, err := parseFlags(args, getenv, hostname, os.Stdout)
	if err != nil {
		return err
	}
	log, err := o.log.Logger(stderr)
	if err != nil {
		return err
	}

	// The bridge exists only after the connection; the reconnect handler
	// reaches it through this pointer.
	var current atomic.Pointer[bridge.Bridge]
	auth, err := o.nats.Options()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(o.natsURL, append(auth,
		nats.Name("kvbridge/"+o.workerID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("NATS disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("NATS reconnected; resyncing KV events so routers that missed batches recover", "url", c.ConnectedUrl())
			if b := current.Load(); b != nil {
				b.Resync()
			}
		}),
	)...)
	if err != nil {
		return fmt.Errorf("connect NATS %s: %w", o.natsURL, err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		log.Info("NATS connected", "url", nc.ConnectedUrl())
	} else {
		log.Warn("NATS unreachable; retrying, KV events wait until it answers", "url", o.natsURL)
	}

	var etcd *clientv3.Client
	if o.etcdEndpoints != "" {
		password, err := o.etcd.Secret()
		if err != nil {
			return err
		}
		etcdTLS, err := o.etcd.TLS()
		if err != nil {
			return err
		}
		etcd, err = clientv3.New(clientv3.Config{
			Endpoints:   strings.Split(o.etcdEndpoints, ","),
			Username:    o.etcd.Username,
			Password:    password,
			TLS:         etcdTLS,
			DialTimeout: 5 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return fmt.Errorf("etcd client %s: %w", o.etcdEndpoints, err)
		}
		defer func() { _ = etcd.Close() }()
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := etcd.Status(sctx, etcd.Endpoints()[0]); err != nil {
			log.Warn("etcd unreachable; the worker registers once it answers", "endpoints", o.etcdEndpoints, "err", err)
		} else {
			log.Info("etcd reachable", "endpoints", o.etcdEndpoints)
		}
		cancel()
	}

	b, err := bridge.New(bridge.Config{
		Namespace:           o.namespace,
		WorkerID:            o.workerID,
		Engine:              engine.Engine(o.engine),
		EngineURL:           o.engineURL,
		EventsEndpoint:      o.eventsEndpoint,
		EventsListen:        o.eventsListen,
		ReplayEndpoint:      o.replayEndpoint,
		Topic:               o.topic,
		DPSize:              o.dpSize,
		Address:             o.advertiseAddress,
		Cluster:             o.cluster,
		BlockSize:           o.blockSize,
		KVTotalBlocks:       o.kvTotalBlocks,
		MaxNumSeqs:          o.maxNumSeqs,
		MaxNumBatchedTokens: o.maxBatched,
		Weight:              o.weight,
		ScrapeInterval:      o.scrapeInterval,
		UnhealthyAfter:      o.unhealthyAfter,
		LeaseTTL:            o.leaseTTL,
		ReplayTimeout:       o.replayTimeout,
		SettleDelay:         o.settleDelay,
		NATS:                nc,
		Etcd:                etcd,
		Logger:              log,
	})
	if err != nil {
		return err
	}
	current.Store(b)
	if o.httpAddr != "" {
		if err := serveStatus(ctx, o.httpAddr, b, log); err != nil {
			return err
		}
	}
	log.Info("kvbridge starting", "worker", o.workerID, "engine", o.engine, "engine_url", o.engineURL,
		"events", o.eventsEndpoint, "events_listen", o.eventsListen, "replay", o.replayEndpoint, "namespace", o.namespace,
		"data_parallel_size", o.dpSize, "register", etcd != nil)
	if err := b.Run(ctx); err != nil {
		return err
	}
	// Flush what is still buffered for NATS before the process goes.
	if err := nc.FlushTimeout(2 * time.Second); err != nil {
		log.Warn("NATS flush on shutdown failed", "err", err)
	}
	s := b.Stats().Snapshot()
	log.Info("kvbridge stopped", "forwarded", s.Forwarded, "replayed", s.Replayed, "heals", s.Heals,
		"heal_failures", s.HealFailures, "resets", s.Resets, "load_reports", s.LoadReports)
	return nil
}
