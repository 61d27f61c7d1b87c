package e2e

import (
	"fmt"
	"testing"
	"time"
)

// When a worker dies and its etcd lease lapses, the router forgets it:
// it leaves discovery, its blocks leave the index, and no request reaches
// it, including requests for prefixes only it held.
func TestLeaseLapseRemovesWorkerAndItsBlocks(t *testing.T) {
	s := start(t, options{leaseTTL: 2 * time.Second})
	system := longText("lease", 30)
	first := s.send(t, chat(system, "hello"))
	victim := first.Worker
	eventually(t, "the victim's blocks in the index", func() bool {
		blocks, _, _ := s.indexed(victim)
		return blocks > 0
	})
	s.Fleet.Worker(victim).Kill()
	eventually(t, "the lease to lapse and the router to drop "+victim, func() bool {
		dw, err := s.Workers(t.Context())
		if err != nil {
			return false
		}
		for _, w := range dw.Workers {
			if w.Record.ID == victim {
				return false
			}
		}
		return true
	})
	if blocks, _, present := s.indexed(victim); present || blocks != 0 {
		t.Errorf("index still holds %d blocks of %s (present %v)", blocks, victim, present)
	}
	// The victim's prefix and fresh prompts all go to the survivors.
	bodies := [][]byte{chat(system, "hello", "hi", "again")}
	for i := 0; i < 12; i++ {
		bodies = append(bodies, chat(longText(fmt.Sprintf("after %d", i), 10), "q"))
	}
	for i, b := range bodies {
		if r := s.send(t, b); r.Worker == victim {
			t.Errorf("request %d reached the dead worker %s", i, victim)
		}
	}
}

// After the NATS server restarts, kvroute reconnects by itself and routes
// on the KV events workers publish afterwards.
func TestNATSRestartRoutesOnFreshEvents(t *testing.T) {
	s := start(t, options{})
	restarted := time.Now()
	s.NATS.Restart(t)
	// Messages published while either side is still reconnecting are lost
	// (core NATS); a load report stamped after the restart shows that
	// workers and router are both back on the bus.
	eventually(t, "load reports from every worker after the restart", func() bool {
		return s.reportsSince(t, restarted) == len(s.ids())
	})
	body := chat(longText("after restart", 30), "where is my prefix?")
	target := "w2"
	if x := s.explain(t, body); x.Chosen == target {
		target = "w3"
	}
	s.direct(t, target, body)
	eventually(t, "the router to learn the prefix from events sent after the restart", func() bool {
		x := s.explain(t, body)
		return x.Chosen == target && x.CachedTokens > 0
	})
	if r := s.send(t, body); r.Worker != target || r.CachedTokens == 0 {
		t.Errorf("request went to %s with %d cached tokens, want %s with its prefix", r.Worker, r.CachedTokens, target)
	}
}

// A KV event batch lost on the way (the worker's sequence number jumps) is
// detected: the router counts a gap and marks the worker's view stale until
// the worker resyncs by clearing its cache.
func TestDroppedEventBatchIsDetectedAsGap(t *testing.T) {
	s := start(t, options{workers: 2})
	const victim = "w1"
	gaps := func() float64 {
		return s.metric(t, "kvroute_kv_event_sequence_total", `worker="`+victim+`"`, `event="gap"`)
	}
	// Traffic before the fault must not count as a gap.
	s.direct(t, victim, chat(longText("before", 20), "q"))
	eventually(t, "the first batch indexed", func() bool {
		blocks, _, _ := s.indexed(victim)
		return blocks > 0
	})
	if g := gaps(); g != 0 {
		t.Fatalf("%v gaps before any batch was dropped", g)
	}
	s.Fleet.Worker(victim).DropNextBatches(1)
	lost := chat(longText("lost", 20), "q")
	s.direct(t, victim, lost)
	// The next batch after the dropped one reveals the gap; wait for the
	// drop first so both requests' events cannot share the dropped batch.
	eventually(t, "the worker to drop a batch", func() bool { return s.Fleet.Worker(victim).Stats().DroppedBatches == 1 })
	s.direct(t, victim, chat(longText("after", 20), "q"))
	eventually(t, "the gap to be counted and the worker marked stale", func() bool {
		_, stale, _ := s.indexed(victim)
		return gaps() >= 1 && stale
	})
	if st := s.Fleet.Worker(victim).Stats(); st.DroppedBatches != 1 {
		t.Fatalf("worker dropped %d batches, want 1", st.DroppedBatches)
	}
	// A cache reset (AllBlocksCleared) resyncs the worker.
	s.Fleet.Worker(victim).ResetCache()
	eventually(t, "the worker to resync after clearing its cache", func() bool {
		_, stale, _ := s.indexed(victim)
		return !stale
	})
}
