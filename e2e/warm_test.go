package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
)

// A replica that (re)starts with --warm-from a running peer loads the
// peer's index before it turns ready: its very first routed requests find
// the prefixes the peer learned, and its predictions of the cached tokens
// match what the workers report (overlap_exact ≥ 95 %).
func TestRestartedReplicaRoutesOnItsPeersIndex(t *testing.T) {
	s := start(t, options{})
	const convs = 20
	second := make([][]byte, convs)
	for i := range convs {
		system := longText(fmt.Sprintf("warm %d", i), 20)
		s.send(t, chat(system, "first question"))
		second[i] = chat(system, "first question", "an answer", "a follow-up")
	}
	for i, body := range second {
		eventually(t, fmt.Sprintf("the peer to index conversation %d", i), func() bool { return s.explain(t, body).CachedTokens > 0 })
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, took := s.startReplica(t, ctx, func(cfg *server.Config) { cfg.Recovery.WarmFrom = s.AdminURL() })
	t.Logf("warm replica started in %v with %d index entries (peer: %d)",
		took.Round(time.Millisecond), b.Index().Stats().Entries, s.Router.Index().Stats().Entries)
	if b.Index().Stats().Entries == 0 {
		t.Fatal("the warm replica's index is empty when Start returns")
	}

	hit, exact := s.followUpsThrough(t, ctx, b, second)
	hits := 0
	for _, h := range hit {
		if h {
			hits++
		}
	}
	overlapExact := float64(exact) / convs
	t.Logf("warm replica's first %d requests: %d found their prefix, overlap_exact %.2f", convs, hits, overlapExact)
	if hits != convs {
		t.Errorf("%d of %d follow-ups found their prefix cached, want all", hits, convs)
	}
	if overlapExact < 0.95 {
		t.Errorf("overlap_exact %.2f, want ≥ 0.95", overlapExact)
	}
}

// startReplica starts a second router on the system's NATS and etcd, with
// loopback listeners and the test model, edited by edit; it returns the
// router and how long Start took (recovery included), and stops it when
// ctx ends or the test does.
func (s *system) startReplica(t *testing.T, ctx context.Context, edit func(*server.Config)) (*server.Server, time.Duration) {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.NATSURL, cfg.EtcdEndpoints = s.NATSURL, s.EtcdEndpoints
	cfg.Tokenizers = map[string]tokenizer.ModelSource{model: {Dir: qwenDir}}
	cfg.ShutdownGrace = 2 * time.Second
	edit(&cfg)
	ctx, cancel := context.WithCancel(ctx)
	started := time.Now()
	b, err := server.Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	took := time.Since(started)
	t.Cleanup(func() { cancel(); _ = b.Wait() })
	return b, took
}

// followUpsThrough sends bodies, in order, through an Envoy in front of the
// system's workers whose ext_proc is replica b (not the system's own
// router), and returns which requests found a cached prefix on their worker
// and how many of them b predicted exactly (overlap_exact's numerator).
func (s *system) followUpsThrough(t *testing.T, ctx context.Context, b *server.Server, bodies [][]byte) (hit []bool, exact int) {
	t.Helper()
	gw, err := bench.StartEnvoy(ctx, bench.EnvoyConfig{
		Style: envoy.StyleClusterHeader, Workers: s.EnvoyWorkers(), ExtProcAddr: b.GRPCAddr(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	c := bench.NewClient(gw.URL())
	defer c.Close()
	hit = make([]bool, len(bodies))
	for i, body := range bodies {
		rctx, rcancel := context.WithTimeout(ctx, waitLong)
		r := c.Do(rctx, &bench.Item{Path: bench.PathChat, Body: body, OutputLen: 8})
		rcancel()
		if r.Err != nil {
			t.Fatalf("request %d through replica %s: %v", i, b.GRPCAddr(), r.Err)
		}
		hit[i] = r.CachedTokens > 0
		if r.PredictedCached != nil && *r.PredictedCached == r.CachedTokens {
			exact++
		}
	}
	return hit, exact
}
