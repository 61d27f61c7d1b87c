package bus

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

// countingMetrics records what the consumer reports.
type countingMetrics struct {
	mu      sync.Mutex
	batches map[BatchOutcome]int
	seq     map[SeqEvent]int
	applied kvindex.ApplyStats
}

func newCountingMetrics() *countingMetrics {
	return &countingMetrics{batches: map[BatchOutcome]int{}, seq: map[SeqEvent]int{}}
}

func (m *countingMetrics) Batch(_ string, o BatchOutcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches[o]++
}

func (m *countingMetrics) Applied(_ string, s kvindex.ApplyStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied.Add(s)
}

func (m *countingMetrics) Sequence(_ string, e SeqEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq[e]++
}

func (m *countingMetrics) batch(o BatchOutcome) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.batches[o]
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConsumerAppliesBatchesFromNATSAndTracksSequences(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w0", testModel, testBS)
	ix.AddWorker("w1", testModel, testBS)
	metrics := newCountingMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	c := NewEventConsumer(nc, EventConsumerConfig{Namespace: "prod", Index: ix, Metrics: metrics})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	prompt := promptHashes(1, 6)
	match := func(w string) kvindex.MatchResult { return ix.Match(prompt, []string{w}, nil)[0] }

	pub := func(w string, seq uint64, evs ...kvindex.Event) {
		t.Helper()
		if err := PublishEvents(nc, "prod", w, seq, kvindex.EventBatch{TS: 1, Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	// In order: the index follows.
	pub("w0", 0, storeEv(1, 0, 2))
	pub("w0", 1, storeEv(1, 2, 4))
	pub("w1", 0, storeEv(1, 0, 1))
	eventually(t, "w0 to hold 4 blocks", func() bool { return match("w0").Blocks == 4 })
	eventually(t, "w1 to hold 1 block", func() bool { return match("w1").Blocks == 1 })

	// Another namespace is not ours.
	if err := PublishEvents(nc, "staging", "w0", 2, kvindex.EventBatch{Events: []kvindex.Event{kvindex.AllBlocksCleared{}}}); err != nil {
		t.Fatal(err)
	}
	// A gap: 2 is lost, 3 arrives.
	pub("w0", 3, removeEv(1, 3))
	eventually(t, "the gap to be counted", func() bool { return c.Stats().Gaps == 1 })
	eventually(t, "the remove after the gap to apply", func() bool { return match("w0").Blocks == 3 })
	if !ix.NeedsResync("w0") || !match("w0").Stale {
		t.Fatal("a gap must mark the worker stale")
	}
	if ix.NeedsResync("w1") {
		t.Fatal("w1 had no gap")
	}
	// A duplicate is skipped.
	pub("w0", 3, removeEv(1, 0))
	// Garbage is dropped and counted; the stream goes on.
	if err := nc.PublishMsg(&nats.Msg{Subject: EventsSubject("prod", "w0"), Header: nats.Header{SeqHeader: {"4"}}, Data: []byte{0xc1}}); err != nil {
		t.Fatal(err)
	}
	// Unknown workers are counted.
	pub("stranger", 0, storeEv(1, 0, 2))
	// AllBlocksCleared resyncs.
	pub("w0", 5, kvindex.AllBlocksCleared{}, storeEv(1, 0, 5))
	eventually(t, "w0 to resync", func() bool { return !ix.NeedsResync("w0") && match("w0").Blocks == 5 })

	st := c.Stats()
	if st.Duplicates != 1 || st.DecodeErrors != 1 || st.UnknownWorker != 1 || st.Gaps != 1 {
		t.Fatalf("consumer stats = %+v", st)
	}
	if metrics.batch(BatchDecodeError) != 1 || metrics.batch(BatchDuplicate) != 1 || metrics.batch(BatchUnknownWorker) != 1 {
		t.Fatalf("metrics batches = %v", metrics.batches)
	}

	// Sequence going back (not to 0) is a restart: stale.
	pub("w0", 2, storeEv(2, 0, 1))
	eventually(t, "the restart to be counted", func() bool { return c.Stats().Restarts == 1 })
	if !ix.NeedsResync("w0") {
		t.Fatal("a restart must mark the worker stale")
	}
	// A fresh stream (0) purges and resyncs.
	pub("w0", 0, storeEv(1, 0, 2))
	eventually(t, "the fresh start", func() bool { return c.Stats().Fresh == 1 && match("w0").Cached == 2 })
	if ix.NeedsResync("w0") || match("w0").Blocks != 2 {
		t.Fatalf("after a fresh start: stale=%v %+v", ix.NeedsResync("w0"), match("w0"))
	}
	metrics.mu.Lock()
	applied := metrics.applied
	gaps := metrics.seq[SeqGap]
	metrics.mu.Unlock()
	if gaps != 1 || applied.StoredBlocks < 10 || applied.RemovedBlocks != 1 || applied.Cleared != 1 {
		t.Fatalf("metrics: gaps=%d applied=%+v", gaps, applied)
	}

	cancel()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("consumer did not stop")
	}
}

func TestConsumerStartFailsWithoutIndex(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := NewEventConsumer(nc, EventConsumerConfig{Namespace: "x"}).Start(context.Background()); err == nil {
		t.Fatal("want an error")
	}
}

func TestSubjects(t *testing.T) {
	if got := EventsSubject("prod", "w0"); got != "kvroute.prod.events.w0" {
		t.Errorf("EventsSubject = %q", got)
	}
	if got := EventsWildcard("prod"); got != "kvroute.prod.events.>" {
		t.Errorf("EventsWildcard = %q", got)
	}
}
