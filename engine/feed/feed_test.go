package feed

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

const model = "test/model"

// engineIP is not 127.0.0.1: a pod has its own address, not the router's.
var engineIP = "127.0.0.2"

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEngine starts a kvsim worker publishing KV events on ZMQ as vLLM
// does, with no NATS: the feed is its only consumer.
func startEngine(t *testing.T) (*sim.Worker, int, int) { return startEngineID(t, "w0") }

// startEngineID is startEngine for a worker named id.
func startEngineID(t *testing.T, id string) (*sim.Worker, int, int) {
	t.Helper()
	pub, rep := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := sim.StartWorker(ctx, sim.WorkerConfig{
		ID: id, Model: model, Speedup: 100,
		Engine:      sim.EngineConfig{NumGPUBlocks: 512, BlockSize: 16},
		ZMQEndpoint: fmt.Sprintf("tcp://%s:%d", engineIP, pub), ZMQReplayEndpoint: fmt.Sprintf("tcp://%s:%d", engineIP, rep), ListenAddr: engineIP + ":0",
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()); cancel() })
	return w, pub, rep
}

func complete(t *testing.T, w *sim.Worker, prompt string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt)
	resp, err := http.Post(w.URL()+"/v1/completions", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: status %d", resp.StatusCode)
	}
}

func blocks(ix *kvindex.Index, id string) int {
	for _, w := range ix.Stats().PerWorker {
		if w.ID == id {
			return w.Blocks
		}
	}
	return -1
}

// startCore runs a KV event core into ix for the test's duration.
func startCore(t *testing.T, ix *kvindex.Index) *kvevents.Core {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	core := kvevents.New(kvevents.Config{Index: ix})
	if err := core.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-core.Done() })
	return core
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The feed follows a kvsim engine's ZMQ events into the index and its
// /metrics into load reports; a batch lost on the wire is replayed; the
// worker's removal stops both.
func TestFeedFollowsEngine(t *testing.T) {
	w, pub, rep := startEngine(t)
	ix := kvindex.New(kvindex.Config{})
	pool := scoring.NewPool(scoring.DefaultOptions())
	spec := w.Record()
	if err := pool.Upsert(spec); err != nil {
		t.Fatal(err)
	}
	ix.AddWorker(spec.ID, spec.Model, spec.BlockSize)
	f, err := New(Config{Events: true, EventsPort: pub, ReplayPort: rep, Load: true, Core: startCore(t, ix), Pool: pool, ScrapeInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Upsert(spec)

	// The subscription is made in the background; keep the engine busy
	// until the first batch lands. Each prompt is new: a repeated one is a
	// cache hit that publishes nothing, so a first batch published before
	// the subscription joined would never be followed by another.
	n := 0
	eventually(t, "KV events in the index", func() bool {
		n++
		complete(t, w, strings.Repeat(fmt.Sprintf("warm the cache %d ", n), 20))
		return blocks(ix, spec.ID) > 0
	})
	eventually(t, "a load report scraped from /metrics", func() bool {
		l, ok := pool.Load(spec.ID)
		return ok && l.ReportFresh && l.Report.KVTotalBlocks == 512
	})

	t.Run("a gap is replayed", func(t *testing.T) {
		heals := f.Stats().Heals.Load()
		w.DropNextZMQBatches(1)
		complete(t, w, strings.Repeat("a prompt lost on the wire ", 20))
		// The gap shows with the next batch the engine sends; keep it busy
		// until one does.
		i := 0
		eventually(t, "the gap healed by replay", func() bool {
			i++
			complete(t, w, fmt.Sprintf("%d %s", i, strings.Repeat("a later prompt ", 20)))
			// Heals counts before the replayed batches are forwarded.
			return f.Stats().Heals.Load() > heals && f.Stats().Replayed.Load() > 0
		})
		if st := f.Stats().Snapshot(); st.HealFailures != 0 || st.Replayed == 0 {
			t.Fatalf("counters %+v: want the missing batch replayed, no gap left unfilled", st)
		}
	})

	t.Run("removal stops the follower", func(t *testing.T) {
		f.Remove(spec.ID)
		if f.Followed() != 0 {
			t.Fatalf("still following %d workers", f.Followed())
		}
		ix.RemoveWorker(spec.ID)
		reports := f.Stats().LoadReports.Load()
		complete(t, w, strings.Repeat("after removal ", 20))
		time.Sleep(300 * time.Millisecond) // a few scrape intervals: nothing may arrive
		if got := f.Stats().LoadReports.Load(); got > reports+1 {
			t.Fatalf("%d load reports after removal", got-reports)
		}
		if ix.HasWorker(spec.ID) {
			t.Fatal("removed worker came back into the index")
		}
	})
}

// Two engines on one host cannot both bind the fleet-wide port: each
// record's events_endpoint and replay_endpoint name its own, and the feed
// dials those instead of the fleet-wide ports (which here lead nowhere).
func TestFeedFollowsPerWorkerEndpoints(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	nowhere := freePort(t)
	f, err := New(Config{Events: true, EventsPort: nowhere, ReplayPort: nowhere, Core: startCore(t, ix)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var engines []*sim.Worker
	for _, id := range []string{"a", "b"} {
		w, pub, rep := startEngineID(t, id)
		spec := w.Record()
		spec.EventsEndpoint = fmt.Sprintf("tcp://%s:%d", engineIP, pub)
		spec.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", engineIP, rep)
		ix.AddWorker(spec.ID, spec.Model, spec.BlockSize)
		f.Upsert(spec)
		engines = append(engines, w)
	}
	for i, w := range engines {
		id := w.Record().ID
		n := 0
		eventually(t, "KV events from "+id, func() bool {
			n++
			complete(t, w, strings.Repeat(fmt.Sprintf("engine %d prompt %d ", i, n), 20))
			return blocks(ix, id) > 0
		})
	}
	heals := f.Stats().Heals.Load()
	engines[1].DropNextZMQBatches(1)
	complete(t, engines[1], strings.Repeat("lost on the wire ", 20))
	i := 0
	eventually(t, "the gap healed through the worker's own replay endpoint", func() bool {
		i++
		complete(t, engines[1], fmt.Sprintf("%d %s", i, strings.Repeat("a later prompt ", 20)))
		return f.Stats().Heals.Load() > heals && f.Stats().Replayed.Load() > 0
	})
	if st := f.Stats().Snapshot(); st.HealFailures != 0 {
		t.Fatalf("counters %+v: want every gap filled by replay", st)
	}
}

func TestReport(t *testing.T) {
	m, err := parseVLLM(`vllm:num_requests_waiting{engine="0"} 3
vllm:num_requests_running{engine="0"} 2
vllm:kv_cache_usage_perc{engine="0"} 0.5
vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="1000"} 1
`)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := Report(m, fleet.Worker{ID: "w", BlockSize: 16, KVTotalBlocks: 7}, time.UnixMilli(42))
	if !ok || r.Waiting != 3 || r.Running != 2 || r.KVUsedBlocks != 500 || r.KVTotalBlocks != 1000 || r.TSMillis != 42 {
		t.Fatalf("report = %+v, want the engine's gauges with its own capacity", r)
	}
	m, _ = parseVLLM("vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.25\n")
	if r, _ := Report(m, fleet.Worker{BlockSize: 16, KVTotalBlocks: 400}, time.Now()); r.KVTotalBlocks != 400 || r.KVUsedBlocks != 100 {
		t.Fatalf("report = %+v, want the record's capacity when the engine names none", r)
	}
}

func parseVLLM(s string) (engine.EngineMetrics, error) {
	return engine.ParseMetrics(engine.EngineVLLM, strings.NewReader(s))
}
