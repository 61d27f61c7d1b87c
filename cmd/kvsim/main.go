// Command kvsim runs simulated vLLM workers for kvroute: an OpenAI-compatible
// HTTP server per worker backed by a paged KV cache with prefix caching,
// continuous batching and a step-time model (Dynamo's mocker polynomial, or a
// GPU profile chosen with --timing), publishing KV events
// and load reports to NATS and registering in etcd under a lease. Run
// `kvsim --help` for the flags.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/multimodal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	os.Exit(cli.Exit("kvsim", err, os.Stderr))
}

// run starts the fleet and serves until ctx ends, then shuts down cleanly.
func run(ctx context.Context, args []string) error {
	if len(args) == 1 && args[0] == "version" {
		args = []string{"--version"}
	}
	o, err := parseFlags(args, os.Getenv, os.Stdout)
	if err != nil {
		return err
	}
	log, err := o.log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	slog.SetDefault(log)

	cfg, err := fleetConfig(o, log)
	if err != nil {
		return err
	}
	start := time.Now()
	log.Info("starting workers", "workers", o.workers, "nats", orNone(o.natsURL), "etcd", orNone(o.etcdEndpoints))
	fleet, err := sim.StartFleet(ctx, cfg)
	if err != nil {
		if o.etcdEndpoints != "" && errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w (etcd at %s did not answer; without etcd, --workers-file serves a router)", err, o.etcdEndpoints)
		}
		return err
	}
	for _, w := range fleet.Workers() {
		log.Info("serving", "worker", w.ID(), "url", w.URL(), "zmq", w.ZMQEndpoint())
	}
	log.Info("fleet started", "workers", len(fleet.Workers()), "model", o.model, "timing", cfg.Worker.Timing.Name(), "block_size", o.blockSize,
		"num_gpu_blocks", o.numGPUBlocks, "nats", orNone(o.natsURL), "etcd", orNone(o.etcdEndpoints), "took", cli.Since(start))
	go fleet.WatchConnections(ctx, 5*time.Second)
	if o.workersFile != "" {
		if err := writeWorkersFile(o.workersFile, fleet.Records()); err != nil {
			_ = fleet.Close(context.Background())
			return err
		}
		log.Info("workers file written", "path", o.workersFile, "workers", len(fleet.Records()))
	}
	if a := fleet.AdminAddr(); a != "" {
		log.Info("admin endpoint", "url", "http://"+a+"/admin/workers")
	}
	<-ctx.Done()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return fleet.Close(sctx)
}

// fleetConfig turns the options into a sim.FleetConfig, loading the
// tokenizer when one is given.
func fleetConfig(o *options, log *slog.Logger) (sim.FleetConfig, error) {
	eng := sim.EngineConfig{
		NumGPUBlocks: o.numGPUBlocks, BlockSize: o.blockSize,
		MaxNumSeqs: o.maxNumSeqs, MaxNumBatchedTokens: o.maxBatched,
	}
	if err := eng.Validate(); err != nil {
		return sim.FleetConfig{}, err
	}
	if o.workers < 1 {
		return sim.FleetConfig{}, cli.Usagef("--workers %d must be at least 1", o.workers)
	}
	if o.speedup <= 0 {
		return sim.FleetConfig{}, fmt.Errorf("--speedup %g must be positive", o.speedup)
	}
	if o.eosProbability < 0 || o.eosProbability > 1 {
		return sim.FleetConfig{}, fmt.Errorf("--eos-probability %g must be in [0, 1]", o.eosProbability)
	}
	if o.jitter < 0 || o.jitter >= 1 {
		return sim.FleetConfig{}, fmt.Errorf("--jitter %g must be in [0, 1)", o.jitter)
	}
	timing, err := sim.ParseTiming(o.timing)
	if err != nil {
		return sim.FleetConfig{}, cli.Usagef("--timing: %w", err)
	}
	wc := sim.WorkerConfig{
		Model: o.model, Engine: eng, Timing: timing, Speedup: o.speedup, Jitter: o.jitter, Seed: o.seed,
		DefaultMaxTokens: o.defaultMaxToks, EOSProbability: o.eosProbability, Namespace: o.namespace, LeaseTTL: o.leaseTTL,
		EventBatchMax: o.eventBatchMax, EventFlushInterval: o.eventFlush, LoadInterval: o.loadInterval,
		ZMQTopic: o.zmqTopic,
		Logger:   log,
	}
	if o.tokenizerDir != "" {
		start := time.Now()
		enc, err := sim.LoadChatEncoder(o.tokenizerDir, o.chatTemplate)
		if err != nil {
			return sim.FleetConfig{}, err
		}
		if o.mmFamily != "" {
			fam, err := multimodal.ParseFamily(o.mmFamily)
			if err != nil {
				return sim.FleetConfig{}, err
			}
			if err := enc.SetMultimodal(fam); err != nil {
				return sim.FleetConfig{}, err
			}
		}
		wc.Encoder = enc
		wc.Engine.VocabSize = enc.Chat.Tokenizer().VocabSize()
		log.Info("tokenizer loaded", "dir", o.tokenizerDir, "vocab", wc.Engine.VocabSize, "took", cli.Since(start))
	} else if o.mmFamily != "" {
		return sim.FleetConfig{}, fmt.Errorf("--mm-family needs --tokenizer")
	} else {
		log.Warn("no --tokenizer: text prompts are encoded one token per byte, which a router with a real tokenizer will not match")
	}
	var etcd []string
	for _, e := range strings.Split(o.etcdEndpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			etcd = append(etcd, e)
		}
	}
	return sim.FleetConfig{
		Workers: o.workers, IDPrefix: o.idPrefix, Host: o.host, BasePort: o.basePort,
		AdvertiseHost: o.advertiseHost, Worker: wc, NATSURL: o.natsURL, EtcdEndpoints: etcd,
		ZMQBasePort: o.zmqBasePort, AdminAddr: o.adminAddr,
	}, nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
