package sim

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

// TestRouterIndexAgreesWithTheEngine feeds kvsim's events to the router's
// own index (which re-hashes token ids and never trusts engine hashes) and
// checks that, through stores and evictions, the index predicts exactly
// the cached_tokens the worker then reports.
func TestRouterIndexAgreesWithTheEngine(t *testing.T) {
	ns := testenv.StartNATS(t)
	w := startTestWorker(t, WorkerConfig{
		Engine: EngineConfig{NumGPUBlocks: 16, BlockSize: 16}, Namespace: "ra", NATS: natsConn(t, ns.URL),
	})
	sub := natsConn(t, ns.URL)
	msgs, err := sub.SubscribeSync(bus.EventsSubject("ra", w.ID()))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker(w.ID(), "test-model", 16)
	seed := kvindex.Seed("test-model", "", "")
	// apply drains the worker's batches that have arrived into the index.
	apply := func() {
		for {
			m, err := msgs.NextMsg(5 * time.Millisecond)
			if err != nil {
				return
			}
			b, err := vllmwire.DecodeBatch(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if st := ix.Apply(w.ID(), b); st.UnknownParent+st.Malformed+st.BlockSizeMismatch > 0 {
				t.Fatalf("index rejected events: %+v", st)
			}
		}
	}
	predicted := func(prompt []int32) int {
		hs := kvindex.HashBlocks(seed, toUint32(prompt), 16, nil)
		res := ix.Match(hs, []string{w.ID()}, nil)
		if res[0].Stale {
			t.Fatal("index marks the worker stale")
		}
		return int(res[0].Blocks) * 16
	}
	run := func(prompt []int32) int {
		_, body := post(t, w.URL()+"/v1/completions", `{"prompt":`+string(mustJSON(prompt))+`,"max_tokens":1}`)
		var r completionResponse
		if err := json.Unmarshal(body, &r); err != nil || r.Usage == nil {
			t.Fatalf("response %s: %v", body, err)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	// settle applies batches until the worker has published everything it
	// produced so far (its batch counter stops moving and all arrived).
	settle := func() {
		waitUntil(t, "events to settle", func() bool {
			before := w.Stats().EventBatches
			time.Sleep(30 * time.Millisecond) // > the 10 ms flush interval
			apply()
			pending, _, _ := msgs.Pending()
			return w.Stats().EventBatches == before && pending == 0
		})
	}
	a, b := seq(0, 100), seq(5000, 200)
	steps := []struct {
		name   string
		prompt []int32
		want   int // cached tokens reported and predicted
	}{
		{"cold A", a, 0},
		{"A again hits its 6 full blocks", a, 96},
		// B needs 13 of 16 blocks: 9 never used, then A's tail first
		// (its partial 7th block, then full blocks 6, 5 and 4).
		{"cold B evicts A's tail", b, 0},
		{"A keeps 3 blocks", a, 48},
	}
	for _, s := range steps {
		settle()
		if got := predicted(s.prompt); got != s.want {
			t.Fatalf("%s: router index predicts %d cached tokens, want %d", s.name, got, s.want)
		}
		if got := run(s.prompt); got != s.want {
			t.Fatalf("%s: worker reports %d cached tokens, want %d", s.name, got, s.want)
		}
	}
	w.ResetCache()
	waitUntil(t, "the reset to reach the index", func() bool { apply(); return predicted(a) == 0 })
}

// routerView is a router-side index fed from a worker's NATS events by the
// KV event core behind bus.SubscribeEvents, as kvroute runs it.
type routerView struct {
	ix   *kvindex.Index
	cons *kvevents.Core
	seed uint64
}

func newRouterView(t *testing.T, url, ns string, workers ...string) *routerView {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ix := kvindex.New(kvindex.Config{})
	for _, w := range workers {
		ix.AddWorker(w, "m", 16)
	}
	cons := kvevents.New(kvevents.Config{Index: ix, Logger: quietLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := cons.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := bus.SubscribeEvents(ctx, nc, ns, cons); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &routerView{ix: ix, cons: cons, seed: kvindex.Seed("m", "", "")}
}

// match returns the cached tokens the router predicts and whether its view
// of the worker is stale.
func (v *routerView) match(worker string, prompt []int32) (int, bool) {
	res := v.ix.Match(kvindex.HashBlocks(v.seed, toUint32(prompt), 16, nil), []string{worker}, nil)
	return int(res[0].Blocks) * 16, res[0].Stale
}

func (v *routerView) waitFor(t *testing.T, what, worker string, prompt []int32, want int) {
	t.Helper()
	waitUntil(t, what, func() bool {
		got, stale := v.match(worker, prompt)
		return got == want && !stale
	})
}

func TestResyncHealsTheRouterAfterLostBatches(t *testing.T) {
	ns := testenv.StartNATS(t)
	f, err := StartFleet(context.Background(), FleetConfig{Workers: 1, NATSURL: ns.URL, Worker: WorkerConfig{
		Model: "m", Namespace: "rs", Speedup: 1000, Engine: EngineConfig{NumGPUBlocks: 64, BlockSize: 16}, Logger: quietLogger(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(context.Background()) })
	w := f.Worker("w0")
	view := newRouterView(t, ns.URL, "rs", "w0")
	gen := func(p []int32) {
		if _, err := w.Generate(context.Background(), p, 1); err != nil {
			t.Fatal(err)
		}
	}
	a, b := seq(0, 70), seq(1000, 70)
	gen(a)
	view.waitFor(t, "A in the router", "w0", a, 64)

	// A lost batch: the router sees the gap and distrusts the worker.
	w.DropNextBatches(1)
	gen(b)
	waitUntil(t, "the drop", func() bool { return w.Stats().DroppedBatches == 1 })
	gen(seq(2000, 70))
	waitUntil(t, "the gap to be seen", func() bool { _, stale := view.match("w0", a); return stale })
	w.Resync()
	view.waitFor(t, "B after resync", "w0", b, 64)
	view.waitFor(t, "A after resync", "w0", a, 64)

	// A NATS outage: batches in flight are lost; on reconnect every worker
	// re-announces its cache.
	ns.Restart(t)
	waitUntil(t, "the reconnect resync", func() bool { return w.Stats().Resyncs == 2 })
	c := seq(3000, 70)
	gen(c)
	view.waitFor(t, "C after the NATS restart", "w0", c, 64)
	view.waitFor(t, "A after the NATS restart", "w0", a, 64)
}
