package kvevents_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvindex"
)

// recorder counts what the core reports.
type recorder struct {
	mu      sync.Mutex
	batches map[kvevents.BatchOutcome]int
	seq     map[kvevents.SeqEvent]int
}

func (m *recorder) Batch(_ string, o kvevents.BatchOutcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches[o]++
}
func (m *recorder) Applied(string, kvindex.ApplyStats) {}
func (m *recorder) Sequence(_ string, e kvevents.SeqEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq[e]++
}

func startCore(t *testing.T, cfg kvevents.Config) (*kvevents.Core, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	core := kvevents.New(cfg)
	if err := core.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-core.Done() })
	return core, ctx
}

// settle waits until everything delivered so far is handled: Do runs on
// the loop, and a delivery queued before it is taken first once the loop
// has nothing else to choose from, so wait for the batch count too.
func settle(t *testing.T, core *kvevents.Core, batches uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for core.Stats().Batches < batches {
		if time.Now().After(deadline) {
			t.Fatalf("core handled %d batches, want %d", core.Stats().Batches, batches)
		}
		time.Sleep(time.Millisecond)
	}
}

// What no transport rule decides: batches for nobody, for workers the index
// does not know, with no number, garbage, and a transport's reset.
func TestCoreCountsWhatItCannotApply(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w", model, bs)
	rec := &recorder{batches: map[kvevents.BatchOutcome]int{}, seq: map[kvevents.SeqEvent]int{}}
	core, ctx := startCore(t, kvevents.Config{Index: ix, Metrics: rec, Logger: quiet})
	deliver := func(d kvevents.Delivery) {
		t.Helper()
		if err := core.Deliver(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	deliver(kvevents.Delivery{Payload: payload(t, 0, 0, false)})                           // no worker named
	deliver(kvevents.Delivery{Worker: "stranger", Payload: payload(t, 0, 0, false)})       // not in the index
	deliver(kvevents.Delivery{Worker: "w", Seq: 0, Payload: []byte{0xc1}})                 // garbage
	deliver(kvevents.Delivery{Worker: "w", NoSeq: true, Payload: payload(t, 0, 1, false)}) // unnumbered
	deliver(kvevents.Delivery{Worker: "w", Seq: 1, Payload: payload(t, 0, 2, false)})
	settle(t, core, 5)
	if got := view(ix, "w", 0, 3); len(got.held) != 2 || got.stale {
		t.Fatalf("view = %+v, want the unnumbered and the numbered batch applied", got)
	}
	deliver(kvevents.Delivery{Worker: "w", Reset: true})
	deliver(kvevents.Delivery{Worker: "w", Seq: 7, Payload: payload(t, 0, 3, false)}) // joins afresh
	settle(t, core, 6)
	if got := view(ix, "w", 0, 4); len(got.held) != 1 || got.held[0] != 3 || got.stale {
		t.Fatalf("after a reset: view = %+v, want only the batch after it, not stale", got)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := map[kvevents.BatchOutcome]int{kvevents.BatchBadSubject: 1, kvevents.BatchUnknownWorker: 1, kvevents.BatchDecodeError: 1, kvevents.BatchApplied: 3}
	for o, n := range want {
		if rec.batches[o] != n {
			t.Errorf("batches[%s] = %d, want %d (all: %v)", o, rec.batches[o], n, rec.batches)
		}
	}
	if rec.seq[kvevents.SeqMissing] != 1 || rec.seq[kvevents.SeqFresh] != 1 || rec.seq[kvevents.SeqJoin] != 1 || rec.seq[kvevents.SeqGap] != 0 {
		t.Errorf("sequence events = %v, want one missing, one fresh (the reset), one join, no gap", rec.seq)
	}
}

// A held core queues deliveries until the hold is released; Seed in
// between makes the queued batches the snapshot holds skip, and Resume
// tells a transport where the snapshot ends until the worker's first batch.
func TestCoreHoldSeedAndResume(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w", model, bs)
	hold := make(chan struct{})
	core, ctx := startCore(t, kvevents.Config{Index: ix, Hold: hold, Logger: quiet})
	deliver := func(seq uint64) {
		t.Helper()
		if err := core.Deliver(ctx, kvevents.Delivery{Worker: "w", Seq: seq, Payload: payload(t, 0, int(seq), false)}); err != nil {
			t.Fatal(err)
		}
	}
	deliver(3)
	deliver(4)
	if core.Stats().Batches != 0 {
		t.Fatal("a held core applied a batch")
	}
	if n := core.Queued(); n != 2 {
		t.Fatalf("a held core has %d deliveries queued, want the 2 delivered", n)
	}
	core.Seed(map[string]uint64{"w": 4})
	close(hold)
	if seq, ok := core.Resume(ctx, "w"); !ok || seq != 4 {
		t.Fatalf("Resume = %d, %v while only batches the snapshot holds came: want the snapshot's 4", seq, ok)
	}
	deliver(5)
	settle(t, core, 3)
	if n := core.Queued(); n != 0 {
		t.Fatalf("%d deliveries still queued after all were handled", n)
	}
	if got := view(ix, "w", 0, 6); len(got.held) != 1 || got.held[0] != 5 || got.stale {
		t.Fatalf("view = %+v, want only batch 5: 3 and 4 are the snapshot's", got)
	}
	if _, ok := core.Resume(ctx, "w"); ok {
		t.Fatal("Resume after the worker's batches arrived: the snapshot's number no longer applies")
	}
	var seqs map[string]uint64
	if err := core.Do(ctx, func(s map[string]uint64) { seqs = map[string]uint64{"w": s["w"]} }); err != nil || seqs["w"] != 5 {
		t.Fatalf("Do saw %v (%v), want w at 5", seqs, err)
	}
}

// A load report claiming a batch that never came is a gap once a later
// claim comes at least ClaimGrace after the first.
func TestCoreClaimOfALostBatchMarksTheWorkerStale(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w", model, bs)
	core, ctx := startCore(t, kvevents.Config{Index: ix, ClaimGrace: time.Nanosecond, Logger: quiet})
	if err := core.Deliver(ctx, kvevents.Delivery{Worker: "w", Seq: 0, Payload: payload(t, 0, 0, false)}); err != nil {
		t.Fatal(err)
	}
	settle(t, core, 1)
	core.Published("w", 0) // met
	core.Published("w", 1) // batch 1 missing: the first claim
	time.Sleep(time.Millisecond)
	core.Published("w", 1) // still missing past the grace
	deadline := time.Now().Add(30 * time.Second)
	for !ix.NeedsResync("w") {
		if time.Now().After(deadline) {
			t.Fatalf("worker not stale after a claim of a lost batch; stats %+v", core.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if core.Stats().Gaps != 1 {
		t.Fatalf("gaps = %d, want 1", core.Stats().Gaps)
	}
}

// An engine that caches in blocks of another size than its worker's
// record: with a BlockSize hook that takes the engine's size, the batch
// that revealed it is applied again and its blocks are held; without one,
// nothing is held.
func TestCoreLearnsTheEnginesBlockSize(t *testing.T) {
	for _, learn := range []bool{true, false} {
		t.Run(map[bool]string{true: "learned", false: "not learned"}[learn], func(t *testing.T) {
			ix := kvindex.New(kvindex.Config{})
			ix.AddWorker("w", model, 2*bs)
			var told []int
			cfg := kvevents.Config{Index: ix, Logger: quiet}
			if learn {
				cfg.BlockSize = func(worker string, n int) bool {
					told = append(told, n)
					ix.AddWorker(worker, model, n)
					return true
				}
			}
			core, ctx := startCore(t, cfg)
			if err := core.Deliver(ctx, kvevents.Delivery{Worker: "w", Seq: 0, Payload: payload(t, 0, 0, false)}); err != nil {
				t.Fatal(err)
			}
			settle(t, core, 1)
			var got []int
			if err := core.Do(ctx, func(map[string]uint64) { got = append(got, told...) }); err != nil {
				t.Fatal(err)
			}
			held := len(view(ix, "w", 0, 1).held)
			switch {
			case learn && (held != 1 || len(got) != 1 || got[0] != bs):
				t.Fatalf("held %d blocks, hook told %v; want the batch applied at the engine's block size %d", held, got, bs)
			case !learn && held != 0:
				t.Fatalf("held %d blocks at a block size the worker is not registered with", held)
			}
		})
	}
}
