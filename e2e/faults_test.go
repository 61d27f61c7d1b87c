package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
)

// When a worker dies and its etcd lease lapses, the router forgets it:
// it leaves discovery and no request reaches it, including requests for
// prefixes only it held. Its index entries outlive it for the lease-flap
// grace (30 s by default; server tests cover their removal), in case the
// same worker registers again.
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
	if blocks, _, present := s.indexed(victim); !present || blocks == 0 {
		t.Errorf("index dropped %s's blocks at once (%d, present %v), want them kept for the lease-flap grace", victim, blocks, present)
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
	// The router started cold: it asked each worker to re-announce its
	// cache once, and the victim did.
	resyncs := func() float64 {
		return s.metric(t, "kvroute_kv_resync_requests_total", `worker="`+victim+`"`, `outcome="ok"`)
	}
	eventually(t, "the cold start's resync request answered", func() bool {
		return resyncs() == 1 && s.Fleet.Worker(victim).Stats().Resyncs == 1
	})
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
	eventually(t, "the gap to be counted", func() bool { return gaps() >= 1 })
	if st := s.Fleet.Worker(victim).Stats(); st.DroppedBatches != 1 {
		t.Fatalf("worker dropped %d batches, want 1", st.DroppedBatches)
	}
	// The router asks the stale worker to resync (NATS request); kvsim
	// re-announces its cache (AllBlocksCleared, then every block) and the
	// view is whole again, including the blocks of the lost batch.
	eventually(t, "the router to request a resync and the worker to be whole again", func() bool {
		_, stale, _ := s.indexed(victim)
		return !stale && resyncs() >= 2
	})
	if st := s.Fleet.Worker(victim).Stats(); st.Resyncs < 2 {
		t.Fatalf("worker resynced %d times, want at least 2 (the cold start's and the gap's)", st.Resyncs)
	}
	// The re-announcement may span several batches after AllBlocksCleared.
	eventually(t, "the lost batch's prefix to be found on "+victim+" again", func() bool {
		x := s.explain(t, chat(longText("lost", 20), "q", "a", "again"))
		return x.Chosen == victim && x.CachedTokens > 0
	})
}

// A worker killed under steady traffic costs no client error: its refused
// connections are retried by the data plane on kvroute's runner-up (the
// next endpoint of its list), and passive health, told by the data plane
// which endpoint served, still ejects it after two failures, long before
// its etcd lease lapses. (Without retries the figure was at most 2.)
func TestKilledWorkerCostsNoClientErrors(t *testing.T) {
	for _, style := range []string{envoy.StyleClusterHeader, envoy.StyleXDS} {
		t.Run(style, func(t *testing.T) { killWorkerUnderTraffic(t, style) })
	}
}

func killWorkerUnderTraffic(t *testing.T, style string) {
	s := start(t, options{leaseTTL: 30 * time.Second, style: style})
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLong)
	defer cancel()
	do := func(i int) bench.Result {
		return s.client.Do(ctx, &bench.Item{Path: bench.PathChat, Body: chat(longText(fmt.Sprintf("steady %d", i), 6), "q"), OutputLen: 8})
	}
	served, victim := map[string]int{}, ""
	for i := range 20 {
		r := do(i)
		if r.Err != nil {
			t.Fatalf("request %d before the kill: %v", i, r.Err)
		}
		served[r.Worker]++
		victim = r.Worker // the worker the router favours right now
	}
	s.Fleet.Worker(victim).Kill()
	killed := time.Now()
	errs, after := 0, map[string]int{}
	for i := 20; i < 80; i++ {
		r := do(i)
		if r.Err != nil {
			errs++
			t.Logf("request %d: %v", i, r.Err)
			continue
		}
		after[r.Worker]++
	}
	t.Logf("before the kill served %v; after: %d client errors, served %v, in %v", served, errs, after, time.Since(killed).Round(time.Millisecond))
	if errs != 0 {
		t.Errorf("%d client errors after the kill, want 0 (each refused connection retried on the runner-up)", errs)
	}
	if n := s.metric(t, "kvroute_worker_ejections_total", `worker="`+victim+`"`); n < 1 {
		t.Errorf("%s was never ejected: the retries hid its failures from passive health", victim)
	}
	if after[victim] != 0 {
		t.Errorf("the dead worker served %d requests", after[victim])
	}
	// Failover came from passive health, not from discovery: the lease has
	// not lapsed, the router still lists the worker.
	dw, err := s.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, w := range dw.Workers {
		listed = listed || w.Record.ID == victim
	}
	if !listed {
		t.Errorf("%s already left discovery after %v; the test needs a longer lease", victim, time.Since(killed))
	}
}
