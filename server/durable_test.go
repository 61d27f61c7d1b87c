package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// chainPublisher publishes one worker's prompt as a chain of BlockStored
// batches, part by part, the way kvsim does.
type chainPublisher struct {
	t      *testing.T
	nc     *nats.Conn
	ns     string
	tokens []uint32
	per    int
}

func newChainPublisher(t *testing.T, url, ns string, parts int) *chainPublisher {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	tokens := promptTokens(t, chatBody(300))
	return &chainPublisher{t: t, nc: nc, ns: ns, tokens: tokens, per: len(tokens) / 16 / parts}
}

func (p *chainPublisher) publish(worker string, seq uint64, part int) {
	p.t.Helper()
	per := p.per
	hs := make([]vllmwire.EngineHash, per)
	for i := range hs {
		hs[i] = vllmwire.HashInt(int64(part*per + i + 1))
	}
	ev := vllmwire.BlockStored{BlockHashes: hs, TokenIDs: p.tokens[part*per*16 : (part+1)*per*16], BlockSize: 16}
	if part > 0 {
		parent := vllmwire.HashInt(int64(part * per))
		ev.ParentBlockHash = &parent
	}
	if err := bus.PublishEvents(p.nc, p.ns, worker, seq, vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{ev}}); err != nil {
		p.t.Fatal(err)
	}
	if err := p.nc.Flush(); err != nil {
		p.t.Fatal(err)
	}
}

// durableFleet is where the durable-events tests start: a JetStream
// server, a workers file, replica A with durable events, a publisher of
// chained batches and a JetStream handle for poking at the stream.
type durableFleet struct {
	n    *testenv.NATS
	file string
	cfgA Config
	a    *Server
	p    *chainPublisher
	js   jetstream.JetStream
}

func startDurableFleet(t *testing.T, workers int) *durableFleet {
	t.Helper()
	testenv.Quiet()
	f := &durableFleet{n: testenv.StartJetStream(t), file: workersFile(t, workers)}
	f.cfgA = f.replica(t, "a")
	f.a = start(t, f.cfgA)
	f.p = newChainPublisher(t, f.n.URL, f.cfgA.Namespace, 4)
	js, err := jetstream.New(f.p.nc)
	if err != nil {
		t.Fatal(err)
	}
	f.js = js
	return f
}

// newestSnapshot returns the newest index snapshot in the fleet's object
// store, failing the test when there is none; the body is closed when the
// test ends.
func (f *durableFleet) newestSnapshot(t *testing.T) (bus.SnapshotMeta, io.ReadCloser) {
	t.Helper()
	store, err := bus.OpenSnapshotStore(context.Background(), f.js, f.cfgA.Namespace, 1)
	if err != nil {
		t.Fatal(err)
	}
	meta, _, body, err := store.Newest(context.Background())
	if err != nil {
		t.Fatalf("no index snapshot stored: %v", err)
	}
	t.Cleanup(func() { body.Close() })
	return meta, body
}

// replica is the durable config of another replica of the same fleet.
func (f *durableFleet) replica(t *testing.T, id string) Config {
	cfg := durableConfig(t, f.n.URL, f.file)
	cfg.RouterID = id
	return cfg
}

func durableConfig(t *testing.T, natsURL, file string) Config {
	cfg := testConfig(t)
	cfg.WorkersFile, cfg.NATSURL = file, natsURL
	cfg.Recovery.DurableEvents = true
	cfg.Recovery.SnapshotInterval = 0 // the tests snapshot with SnapshotNow
	cfg.Recovery.ResyncInterval = 0
	return cfg
}

// A router with --durable-events consumes the events the JetStream stream
// captured from plain core publishes and stores snapshots; a fresh replica
// (no peer) loads the newest snapshot and replays the stream after it
// before Start returns, then follows the live tail without a gap or a
// batch applied twice.
func TestDurableEventsRecoverFromSnapshotThenStream(t *testing.T) {
	f := startDurableFleet(t, 3)
	a, p := f.a, f.p
	per := p.per

	p.publish("w1", 0, 0)
	p.publish("w1", 1, 1)
	eventually(t, "A indexes two batches from the stream", func() bool { return a.Index().Stats().Entries == 2*per })
	seq, err := a.SnapshotNow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if seq != 2 {
		t.Fatalf("A's snapshot covers stream sequence %d, want 2", seq)
	}
	// After the snapshot: one more batch for w1 and one for w2.
	p.publish("w1", 2, 2)
	p.publish("w2", 0, 0)
	eventually(t, "A applies the batches after its snapshot", func() bool { return a.Index().Stats().Entries == 4*per })

	cfgB := f.replica(t, "b")
	cfgB.Registry = nil
	b := start(t, cfgB)
	if got := b.Index().Stats().Entries; got != 4*per {
		t.Fatalf("fresh replica holds %d entries when Start returns, want A's %d (snapshot + replay)", got, 4*per)
	}
	if got := b.events.Cursor(); got != 4 {
		t.Fatalf("fresh replica's consumer is at stream sequence %d when Start returns, want 4", got)
	}
	if got := metricValue(t, b, "kvroute_index_recovery_replayed_messages"); got != 2 {
		t.Fatalf("recovery replayed %v messages, want the 2 after the snapshot", got)
	}
	// The live tail: a repeat of the last w1 batch is skipped, the next
	// applies, nothing is stale.
	p.publish("w1", 2, 2)
	p.publish("w1", 3, 3)
	eventually(t, "both replicas apply the live tail", func() bool {
		return a.Index().Stats().Entries == 5*per && b.Index().Stats().Entries == 5*per
	})
	for _, w := range []string{"w1", "w2"} {
		if b.Index().NeedsResync(w) {
			t.Fatalf("%s stale on the recovered replica", w)
		}
	}
	if st := b.events.Stats(); st.Gaps != 0 || st.Restarts != 0 || st.Duplicates != 1 {
		t.Fatalf("recovered replica's consumer %+v, want no gap or restart and the repeated batch skipped", st)
	}
	if got, want := b.Index().Match(kvindex.HashBlocks(kvindex.Seed(model, "", ""), p.tokens, 16, nil), []string{"w1"}, nil)[0].Blocks, int32(4*per); got != want {
		t.Fatalf("recovered replica matches %d blocks of the prompt on w1, want %d", got, want)
	}

	// Newest wins: B's snapshot (sequence 6) supersedes A's (2) and is the
	// only one left in the bucket.
	if seq, err := b.SnapshotNow(context.Background()); err != nil || seq != 6 {
		t.Fatalf("B's snapshot: seq %d, %v; want 6", seq, err)
	}
	meta, body := f.newestSnapshot(t)
	if meta.StreamSeq != 6 || meta.Router != "b" {
		t.Fatalf("newest snapshot %+v, want B's at sequence 6", meta)
	}
	if _, err := kvindex.ReadSnapshot(body); err != nil {
		t.Fatalf("stored snapshot does not decode: %v", err)
	}
}

// When stream messages after the newest snapshot are gone (aged out or
// discarded by the size limit; here: purged), the recovering replica
// cannot know which workers they touched: it says so, counts them, marks
// every worker stale and asks each to resync.
func TestDurableEventsAgedOutMarksWorkersStaleAndResyncs(t *testing.T) {
	f := startDurableFleet(t, 2)
	cfgA, a, p := f.cfgA, f.a, f.p
	p.publish("w1", 0, 0)
	eventually(t, "A indexes a batch", func() bool { return a.Index().Stats().Entries == p.per })
	if _, err := a.SnapshotNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.publish("w1", 1, 1)
	p.publish("w0", 0, 0)
	eventually(t, "A applies the batches after its snapshot", func() bool { return a.Index().Stats().Entries == 3*p.per })
	js := f.js
	stream, err := js.Stream(context.Background(), bus.EventStreamName(cfgA.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	asked := map[string]bool{}
	for _, w := range []string{"w0", "w1"} {
		sub, err := bus.ServeResync(p.nc, cfgA.Namespace, w, func(bus.ResyncRequest) error {
			mu.Lock()
			asked[w] = true
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	var logs testenv.SyncBuffer
	cfgB := f.replica(t, "b")
	cfgB.Recovery.ResyncInterval = 100 * time.Millisecond
	cfgB.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := start(t, cfgB)
	if got := metricValue(t, b, "kvroute_kv_events_aged_out_total"); got != 2 {
		t.Fatalf("kvroute_kv_events_aged_out_total %v, want the 2 purged messages", got)
	}
	if !strings.Contains(logs.String(), "aged out of the stream") {
		t.Fatalf("no log line says events aged out:\n%s", logs.String())
	}
	for _, w := range []string{"w0", "w1"} {
		if !b.Index().NeedsResync(w) {
			t.Fatalf("%s is not stale after events were lost", w)
		}
	}
	eventually(t, "both workers are asked to resync", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return asked["w0"] && asked["w1"]
	})
	// The re-announcement (AllBlocksCleared first, as kvsim and kvbridge
	// send it) clears the staleness.
	if err := bus.PublishEvents(p.nc, cfgA.Namespace, "w1", 2, vllmwire.EventBatch{TS: 2, Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "w1's resync clears its staleness", func() bool { return !b.Index().NeedsResync("w1") })
}

// A stream created again after the snapshot (its sequence started over,
// so the snapshot is ahead of it) is replayed from its first message, and
// every worker is stale until it resyncs.
func TestDurableEventsStreamCreatedAgainIsReplayedWhole(t *testing.T) {
	f := startDurableFleet(t, 2)
	cfgA, a, p := f.cfgA, f.a, f.p
	for part := range 3 {
		p.publish("w1", uint64(part), part)
	}
	eventually(t, "A indexes three batches", func() bool { return a.Index().Stats().Entries == 3*p.per })
	if err := a.Shutdown(); err != nil { // its shutdown snapshot covers sequence 3
		t.Fatal(err)
	}
	js := f.js
	ctx := context.Background()
	if err := js.DeleteStream(ctx, bus.EventStreamName(cfgA.Namespace)); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.EnsureEventStream(ctx, js, cfgA.Namespace, bus.EventStreamLimits{MaxAge: time.Hour, MaxBytes: 1 << 30, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	p.publish("w0", 0, 0) // sequence 1 of the new stream

	var logs testenv.SyncBuffer
	cfgB := f.replica(t, "b")
	cfgB.Recovery.ResyncInterval = 0
	cfgB.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := start(t, cfgB)
	if got := b.Index().Stats().Entries; got != 4*p.per {
		t.Fatalf("B holds %d entries, want the snapshot's %d plus the new stream's %d", got, 3*p.per, p.per)
	}
	if got := metricValue(t, b, "kvroute_index_recovery_replayed_messages"); got != 1 {
		t.Fatalf("B replayed %v messages, want the new stream's 1", got)
	}
	if !b.Index().NeedsResync("w1") {
		t.Fatal("w1 is not stale although the stream it was in is gone")
	}
	if !strings.Contains(logs.String(), "ahead of the stream") {
		t.Fatalf("no log line says the stream was created again:\n%s", logs.String())
	}
}

// A clean shutdown stores one last snapshot, so the next replica has
// nothing to replay.
func TestDurableEventsSnapshotOnCleanShutdown(t *testing.T) {
	f := startDurableFleet(t, 2)
	a, p := f.a, f.p
	p.publish("w1", 0, 0)
	p.publish("w1", 1, 1)
	eventually(t, "A indexes two batches", func() bool { return a.Index().Stats().Entries == 2*p.per })
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	meta, _ := f.newestSnapshot(t)
	if meta.StreamSeq != 2 || meta.Router != "a" {
		t.Fatalf("snapshot after shutdown %+v, want A's at stream sequence 2", meta)
	}
	cfgB := f.replica(t, "b")
	b := start(t, cfgB)
	if got := b.Index().Stats().Entries; got != 2*p.per {
		t.Fatalf("B holds %d entries, want %d", got, 2*p.per)
	}
	if got := metricValue(t, b, "kvroute_index_recovery_replayed_messages"); got != 0 {
		t.Fatalf("B replayed %v messages after the shutdown snapshot, want 0", got)
	}
}

// The stream consumer survives a NATS restart (same store): the ordered
// consumer resumes after the last message it delivered, so the batch
// published after the restart applies without a gap or a repeat.
func TestDurableEventsSurviveNATSRestart(t *testing.T) {
	testenv.Quiet()
	n := testenv.StartJetStream(t)
	file := workersFile(t, 2)
	cfg := durableConfig(t, n.URL, file)
	a := start(t, cfg)
	p := newChainPublisher(t, n.URL, cfg.Namespace, 4)
	p.publish("w1", 0, 0)
	eventually(t, "A indexes a batch", func() bool { return a.Index().Stats().Entries == p.per })
	n.Restart(t)
	eventually(t, "A and the publisher reconnect", func() bool { return a.nc.IsConnected() && p.nc.IsConnected() })
	p.publish("w1", 1, 1)
	// The consumer counts a batch after the index applied it: wait for
	// both, then check how it got there.
	eventually(t, "A applies the batch published after the restart", func() bool {
		return a.Index().Stats().Entries == 2*p.per && a.events.Stats().Applied >= 2
	})
	if st := a.events.Stats(); st.Gaps != 0 || st.Duplicates != 0 || st.Applied != 2 {
		t.Fatalf("consumer after the restart %+v, want 2 applied, no gap or repeat", st)
	}
	if got := a.events.Cursor(); got != 2 {
		t.Fatalf("consumer at stream sequence %d, want 2", got)
	}
}

// --durable-events with the embedded NATS server turns JetStream on in the
// given store directory.
func TestDurableEventsWithEmbeddedNATS(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 1)
	cfg.Recovery.DurableEvents = true
	cfg.Recovery.JetStreamDir = t.TempDir()
	r := start(t, cfg)
	if r.natsSrv == nil || !r.natsSrv.JetStreamEnabled() {
		t.Fatal("embedded NATS without JetStream under --durable-events")
	}
	if got := r.natsSrv.StoreDir(); !strings.HasPrefix(got, cfg.Recovery.JetStreamDir) {
		t.Fatalf("JetStream store %q, want under %q", got, cfg.Recovery.JetStreamDir)
	}
	if _, err := r.SnapshotNow(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Two routers whose embedded NATS servers would share one JetStream store:
// the second stops at start with an error naming the directory (nats-server
// itself would open the same files twice), and once the first has stopped
// the store can be taken again.
func TestDurableEventsRefuseASharedJetStreamStore(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 1)
	cfg.Recovery.DurableEvents = true
	cfg.Recovery.JetStreamDir = t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	first, err := Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	second, err := Start(ctx2, cfg)
	if err == nil {
		cancel2()
		_ = second.Wait()
		cancel()
		t.Fatal("a second router started on the same JetStream store")
	}
	if !strings.Contains(err.Error(), cfg.Recovery.JetStreamDir) || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("second router: %v, want an error naming the store as in use", err)
	}
	cancel()
	if err := first.Wait(); err != nil {
		t.Fatal(err)
	}
	start(t, cfg) // the lock went with the first router
}

// The default store is one per embedded NATS port, so routers on different
// ports of one host do not collide and a restart on the same port finds its
// stream; a random port gets a fresh directory.
func TestDefaultJetStreamDirIsPerPort(t *testing.T) {
	if a, b := defaultJetStreamDir(4222), defaultJetStreamDir(4223); a == b || !strings.HasSuffix(a, "kvroute-jetstream-4222") {
		t.Fatalf("ports 4222 and 4223 give %q and %q", a, b)
	}
	a, b := defaultJetStreamDir(natsserver.RANDOM_PORT), defaultJetStreamDir(natsserver.RANDOM_PORT)
	t.Cleanup(func() { os.RemoveAll(a); os.RemoveAll(b) })
	if a == b {
		t.Fatalf("two random-port routers share the store %q", a)
	}
}

func TestDurableEventsConfigRules(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = "w.yaml"
	cfg.Recovery.DurableEvents = true
	cfg.Recovery.WarmFrom = "http://127.0.0.1:9091"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--durable-events and --warm-from") {
		t.Fatalf("durable events with warm-from: %v, want a clear refusal", err)
	}
	cfg.Recovery.WarmFrom = ""
	cfg.KVEvents = false
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "needs KV events over NATS") {
		t.Fatalf("durable events without KV events: %v, want a clear refusal", err)
	}
	// Without JetStream on the server, Start says so.
	n := testenv.StartNATS(t)
	cfg = durableConfig(t, n.URL, workersFile(t, 1))
	_, err := Start(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "JetStream enabled") {
		t.Fatalf("durable events against NATS without JetStream: %v, want an error naming JetStream", err)
	}
}

// BenchmarkDurableRecovery1M measures a --durable-events recovery of
// 1 M index entries (16 workers × 65,536 blocks, published as 2,048
// batches of 512 blocks through the stream): replica A applies them and
// stores its snapshot; 256 more batches (131,072 entries) follow in the
// stream only; each iteration starts a fresh replica B, which loads the
// snapshot from the object store and replays the tail before Start
// returns. recovery_s is kvroute_index_recovery_seconds (snapshot fetch,
// decode and load, then the replay), snapshot_load_s its first part,
// start_s all of Start.
//
//	go test -run '^$' -bench DurableRecovery1M -benchtime 3x ./server/
func BenchmarkDurableRecovery1M(b *testing.B) {
	testenv.Quiet()
	n := testenv.StartJetStream(b)
	const workers, perWorker, perBatch, tail = 16, 1 << 16, 512, 256
	var sb strings.Builder
	sb.WriteString("workers:\n")
	for i := range workers {
		fmt.Fprintf(&sb, "- {id: w%d, model: %q, address: '10.0.0.%d:8000', block_size: 16, kv_total_blocks: 200000, max_num_batched_tokens: 8192}\n", i, model, i+1)
	}
	file := filepath.Join(b.TempDir(), "workers.yaml")
	if err := os.WriteFile(file, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	config := func(id string) Config {
		cfg := DefaultConfig()
		cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		cfg.Logger, cfg.ShutdownGrace, cfg.RouterID = quiet(), time.Second, id
		cfg.WorkersFile, cfg.NATSURL = file, n.URL
		cfg.Recovery.DurableEvents, cfg.Recovery.SnapshotInterval, cfg.Recovery.ResyncInterval = true, 0, 0
		cfg.Recovery.EventsMaxBytes = 0
		return cfg
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := Start(ctx, config("a"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = a.Wait() }()
	nc, err := nats.Connect(n.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	seqs := map[string]uint64{}
	chain := 0
	publish := func(w int) {
		toks := make([]uint32, perBatch*16)
		for i := range toks {
			toks[i] = uint32(chain)*7919 + uint32(i)*31 + 1
		}
		hs := make([]vllmwire.EngineHash, perBatch)
		for j := range hs {
			hs[j] = vllmwire.HashUint(uint64(chain)<<24 | uint64(j) + 1)
		}
		chain++
		id := fmt.Sprint("w", w)
		if err := bus.PublishEvents(nc, "default", id, seqs[id], vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: 16}}}); err != nil {
			b.Fatal(err)
		}
		seqs[id]++
	}
	waitEntries := func(r *Server, want int) {
		deadline := time.Now().Add(5 * time.Minute)
		for r.Index().Stats().Entries != want {
			if time.Now().After(deadline) {
				b.Fatalf("%d entries, want %d", r.Index().Stats().Entries, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for w := range workers {
		for range perWorker / perBatch {
			publish(w)
		}
	}
	_ = nc.Flush()
	waitEntries(a, workers*perWorker)
	if _, err := a.SnapshotNow(ctx); err != nil {
		b.Fatal(err)
	}
	for i := range tail {
		publish(i % workers)
	}
	_ = nc.Flush()
	want := workers*perWorker + tail*perBatch
	waitEntries(a, want)
	b.Logf("snapshot of %d entries: %.1f MB in the object store; %d messages after it", workers*perWorker,
		gaugeValue(a.metrics.health.snapshotBytes)/1e6, tail)

	var recovery, load, startup float64
	b.ResetTimer()
	for range b.N {
		cfg := config("b")
		bctx, bcancel := context.WithCancel(context.Background())
		t0 := time.Now()
		rb, err := Start(bctx, cfg)
		if err != nil {
			bcancel()
			b.Fatal(err)
		}
		startup += time.Since(t0).Seconds()
		b.StopTimer()
		if got := rb.Index().Stats().Entries; got != want {
			b.Fatalf("B holds %d entries when Start returns, want %d", got, want)
		}
		if got := gaugeValue(rb.metrics.health.recoveryReplayed); got != tail {
			b.Fatalf("B replayed %v messages, want %d", got, tail)
		}
		recovery += gaugeValue(rb.metrics.health.recoverySeconds)
		load += rb.durable.loadTook.Seconds()
		rb.durable = nil // no shutdown snapshot: the next iteration recovers from A's
		bcancel()
		_ = rb.Wait()
		b.StartTimer()
	}
	b.ReportMetric(recovery/float64(b.N), "recovery_s")
	b.ReportMetric(load/float64(b.N), "snapshot_load_s")
	b.ReportMetric(startup/float64(b.N), "start_s")
}

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}
