package kvevents_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine/feed"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

const (
	model = "test/model"
	bs    = 16
)

// step is one batch a publisher sends for the worker under test: its
// sequence number and what it carries. Each step stores its own block (a
// root block made of tokens only it uses), so the blocks the index holds
// at the end say exactly which steps survived.
type step struct {
	seq   uint64
	clear bool // AllBlocksCleared before the block
}

// outcome is the worker's view at the end of a row: the steps whose
// blocks it holds (indexes into steps; -1 is the snapshot's block) and
// whether it is stale.
type outcome struct {
	held  []int
	stale bool
}

// counts are the core's totals a row checks where the core sees the
// publisher's numbers unchanged (directly and over NATS).
type counts struct{ gaps, restarts, fresh, duplicates uint64 }

// sequenceRows are the sequencing rules, run for every transport. zmq,
// when set, is the outcome over ZMQ where the rule is transport-specific:
// the engine feed heals a gap from the engine's replay socket before the
// core sees it (these rows run with none, so the feed clears the worker's
// view and goes on from the batch after the gap instead of marking it
// stale), and a live socket that repeats or goes back is a restarted
// engine (docs/architecture.md §3.2).
var sequenceRows = []struct {
	name   string
	seeded *uint64 // a loaded snapshot holding the worker's batches up to this number, and one block
	steps  []step
	want   outcome
	counts counts
	zmq    *outcome
}{
	{name: "in order", steps: []step{{seq: 0}, {seq: 1}, {seq: 2}},
		want: outcome{held: []int{0, 1, 2}}},
	{name: "join mid-stream", steps: []step{{seq: 5}, {seq: 6}},
		want: outcome{held: []int{0, 1}}},
	{name: "a repeated number is skipped", steps: []step{{seq: 0}, {seq: 1}, {seq: 1}, {seq: 2}},
		want: outcome{held: []int{0, 1, 3}}, counts: counts{duplicates: 1},
		zmq: &outcome{held: []int{2, 3}}},
	{name: "a gap marks the worker stale", steps: []step{{seq: 0}, {seq: 1}, {seq: 3}},
		want: outcome{held: []int{0, 1, 2}, stale: true}, counts: counts{gaps: 1},
		zmq: &outcome{held: []int{2}}},
	{name: "AllBlocksCleared resyncs a stale worker", steps: []step{{seq: 0}, {seq: 2}, {seq: 3, clear: true}},
		want: outcome{held: []int{2}}, counts: counts{gaps: 1}},
	{name: "going back, not to 0, is a restart: stale", steps: []step{{seq: 0}, {seq: 1}, {seq: 2}, {seq: 1}},
		want: outcome{held: []int{0, 1, 2, 3}, stale: true}, counts: counts{restarts: 1},
		zmq: &outcome{held: []int{3}}},
	{name: "0 after a known stream is a fresh start: purged", steps: []step{{seq: 0}, {seq: 1}, {seq: 2}, {seq: 0}},
		want: outcome{held: []int{3}}, counts: counts{fresh: 1}},
	{name: "a fresh start clears staleness", steps: []step{{seq: 0}, {seq: 2}, {seq: 0}, {seq: 1}},
		want: outcome{held: []int{2, 3}}, counts: counts{gaps: 1, fresh: 1}},
	{name: "snapshot seeding skips what the snapshot holds and goes on after it", seeded: ptr(uint64(4)),
		steps: []step{{seq: 3}, {seq: 4}, {seq: 5}},
		want:  outcome{held: []int{-1, 2}}, counts: counts{duplicates: 2}},
	{name: "a gap right after the snapshot marks the worker stale", seeded: ptr(uint64(4)),
		steps: []step{{seq: 6}},
		want:  outcome{held: []int{-1, 0}, stale: true}, counts: counts{gaps: 1},
		zmq: &outcome{held: []int{0}}},
	{name: "0 after the snapshot is a fresh start", seeded: ptr(uint64(4)),
		steps: []step{{seq: 0}},
		want:  outcome{held: []int{0}}, counts: counts{fresh: 1}},
}

var quiet = slog.New(slog.DiscardHandler)

func ptr[T any](v T) *T { return &v }

// tokens is the one block step i stores (i = -1: the snapshot's).
func tokens(row, i int) []uint32 {
	out := make([]uint32, bs)
	for k := range out {
		out[k] = uint32(row<<20 | (i+2)<<8 | k)
	}
	return out
}

func payload(t *testing.T, row, i int, clear bool) []byte {
	t.Helper()
	toks := tokens(row, i)
	var evs []vllmwire.Event
	if clear {
		evs = append(evs, vllmwire.AllBlocksCleared{})
	}
	evs = append(evs, vllmwire.BlockStored{BlockHashes: []vllmwire.EngineHash{vllmwire.HashInt(int64(row<<20 | (i+2)<<8))},
		TokenIDs: toks, BlockSize: bs})
	r := 0
	data, err := vllmwire.EncodeBatch(vllmwire.EventBatch{TS: 1, Events: evs, DPRank: &r, Format: vllmwire.FormatArray})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// view reads the worker's outcome from the index: which of the row's
// blocks it holds, and its stale flag.
func view(ix *kvindex.Index, worker string, row, steps int) outcome {
	var o outcome
	seed := kvindex.Seed(model, "", "")
	for i := -1; i < steps; i++ {
		m := ix.Match(kvindex.HashBlocks(seed, tokens(row, i), bs, nil), []string{worker}, nil)[0]
		if m.Blocks == 1 {
			o.held = append(o.held, i)
		}
		o.stale = m.Stale
	}
	return o
}

// transport delivers a row's batches to a core, as one of the real
// transports does.
type transport interface {
	// start wires a started core for worker w (already in ix) and returns
	// how to send one batch.
	start(t *testing.T, ctx context.Context, core *kvevents.Core, ix *kvindex.Index) func(seq uint64, payload []byte)
	// exact says the core sees the publisher's numbers unchanged, so its
	// counts are the row's.
	exact() bool
}

// direct hands batches to the core itself.
type direct struct{}

func (direct) exact() bool { return true }
func (direct) start(t *testing.T, ctx context.Context, core *kvevents.Core, _ *kvindex.Index) func(uint64, []byte) {
	return func(seq uint64, p []byte) {
		if err := core.Deliver(ctx, kvevents.Delivery{Worker: "w", Seq: seq, Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
}

// overNATS publishes on a real (embedded) NATS server with bus.SeqHeader,
// as kvbridge and kvsim do, to a core behind bus.SubscribeEvents.
type overNATS struct{ url string }

func (overNATS) exact() bool { return true }
func (n overNATS) start(t *testing.T, ctx context.Context, core *kvevents.Core, _ *kvindex.Index) func(uint64, []byte) {
	nc, err := nats.Connect(n.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ns := fmt.Sprintf("seq%d", time.Now().UnixNano())
	if err := bus.SubscribeEvents(ctx, nc, ns, core); err != nil {
		t.Fatal(err)
	}
	return func(seq uint64, p []byte) {
		msg := nats.NewMsg(bus.EventsSubject(ns, "w"))
		msg.Header.Set(bus.SeqHeader, strconv.FormatUint(seq, 10))
		msg.Data = p
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
}

// overZMQ is an engine's PUB socket connected to the router's bound
// listener (--engine-events-listen), numbering its batches by hand, with
// no replay socket; the engine feed follows it into the core.
type overZMQ struct{}

func (overZMQ) exact() bool { return false }
func (overZMQ) start(t *testing.T, ctx context.Context, core *kvevents.Core, ix *kvindex.Index) func(uint64, []byte) {
	f, err := feed.New(feed.Config{Events: true, Listen: "tcp://127.0.0.1:0", ReplayPort: -1, Core: core, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	// The primer is a second worker on the same socket: once its batch is
	// in, the PUB is connected (ZMQ drops what a PUB sends before that).
	ix.AddWorker("primer", model, bs)
	f.Upsert(fleet.Worker{ID: "w", Model: model, Address: "127.0.0.2:8000", BlockSize: bs})
	f.Upsert(fleet.Worker{ID: "primer", Model: model, Address: "127.0.0.3:8000", BlockSize: bs})
	pub := zmq4.NewPub(context.Background())
	t.Cleanup(func() { _ = pub.Close() })
	if err := pub.Dial(f.ListenEndpoint()); err != nil {
		t.Fatal(err)
	}
	send := func(topic string, seq uint64, p []byte) {
		if err := pub.Send(zmq4.NewMsgFrom(vllmzmq.EventFrames(topic, seq, p)...)); err != nil {
			t.Fatal(err)
		}
	}
	primed := func() bool {
		for _, w := range ix.Stats().PerWorker {
			if w.ID == "primer" && w.Blocks > 0 {
				return true
			}
		}
		return false
	}
	for seq := uint64(0); !primed(); seq++ {
		if seq > 500 {
			t.Fatal("the engine's PUB never reached the listener")
		}
		send("kv@127.0.0.3:8000@"+model, seq, payload(t, 1<<10, int(seq), false))
		time.Sleep(10 * time.Millisecond)
	}
	return func(seq uint64, p []byte) { send("kv@127.0.0.2:8000@"+model, seq, p) }
}

// TestSequenceRules runs every sequencing rule through each transport:
// the core itself, NATS (bus) and an engine's ZMQ socket (engine/feed).
func TestSequenceRules(t *testing.T) {
	srv := testenv.StartNATS(t)
	transports := []struct {
		name string
		tr   transport
	}{{"direct", direct{}}, {"nats", overNATS{url: srv.URL}}, {"zmq", overZMQ{}}}
	for _, tp := range transports {
		t.Run(tp.name, func(t *testing.T) {
			for ri, row := range sequenceRows {
				t.Run(row.name, func(t *testing.T) {
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					ix := kvindex.New(kvindex.Config{})
					ix.AddWorker("w", model, bs)
					core := kvevents.New(kvevents.Config{Index: ix, Logger: quiet})
					if row.seeded != nil {
						// What a warm start does: load the snapshot, seed.
						ix.Apply("w", mustDecode(t, payload(t, ri, -1, false)))
						core.Seed(map[string]uint64{"w": *row.seeded})
					}
					if err := core.Start(ctx); err != nil {
						t.Fatal(err)
					}
					send := tp.tr.start(t, ctx, core, ix)
					for i, s := range row.steps {
						send(s.seq, payload(t, ri, i, s.clear))
					}
					want := row.want
					if row.zmq != nil && tp.name == "zmq" {
						want = *row.zmq
					}
					deadline := time.Now().Add(30 * time.Second)
					for got := view(ix, "w", ri, len(row.steps)); !slices.Equal(got.held, want.held) || got.stale != want.stale; got = view(ix, "w", ri, len(row.steps)) {
						if time.Now().After(deadline) {
							t.Fatalf("worker's view = %+v, want %+v", got, want)
						}
						time.Sleep(5 * time.Millisecond)
					}
					if !tp.tr.exact() {
						return
					}
					st := core.Stats()
					if got := (counts{st.Gaps, st.Restarts, st.Fresh, st.Duplicates}); got != row.counts {
						t.Errorf("counts = %+v, want %+v", got, row.counts)
					}
				})
			}
		})
	}
}

func mustDecode(t *testing.T, p []byte) vllmwire.EventBatch {
	t.Helper()
	b, err := vllmwire.DecodeBatch(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
