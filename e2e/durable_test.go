package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/server"
)

// With --durable-events, a replica started fresh, with no peer to copy,
// recovers the index from the newest snapshot in the NATS object store and
// the JetStream stream after it before it turns ready: its very first
// routed requests find the prefixes learned before and after that
// snapshot, and its predictions of the cached tokens match what the
// workers report (overlap_exact ≥ 95 %).
func TestFreshReplicaRecoversFromDurableEvents(t *testing.T) {
	s := start(t, options{jetstream: true, router: func(c *server.Config) {
		c.Recovery.DurableEvents = true
		c.Recovery.SnapshotInterval = 0 // snapshot on cue below
		c.RouterID = "replica-a"
	}})
	const before, after = 15, 10
	second := make([][]byte, before+after)
	send := func(from, to int) {
		for i := from; i < to; i++ {
			system := longText(fmt.Sprintf("durable %d", i), 20)
			s.send(t, chat(system, "first question"))
			second[i] = chat(system, "first question", "an answer", "a follow-up")
		}
		for i := from; i < to; i++ {
			eventually(t, fmt.Sprintf("replica A to index conversation %d", i), func() bool { return s.explain(t, second[i]).CachedTokens > 0 })
		}
	}
	send(0, before)
	seq, err := s.Router.SnapshotNow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send(before, before+after) // only in the stream, after the snapshot

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, took := s.startReplica(t, ctx, func(cfg *server.Config) {
		cfg.Recovery.DurableEvents = true
		cfg.RouterID = "replica-b"
	})
	t.Logf("fresh replica recovered in %v with %d index entries (A: %d; A's snapshot covered stream sequence %d)",
		took.Round(time.Millisecond), b.Index().Stats().Entries, s.Router.Index().Stats().Entries, seq)
	if b.Index().Stats().Entries == 0 {
		t.Fatal("the recovered replica's index is empty when Start returns")
	}

	hit, exact := s.followUpsThrough(t, ctx, b, second)
	hits, hitsAfter := 0, 0
	for i, h := range hit {
		if h {
			hits++
			if i >= before {
				hitsAfter++
			}
		}
	}
	n := before + after
	overlapExact := float64(exact) / float64(n)
	t.Logf("recovered replica's first %d requests: %d found their prefix (%d of the %d learned after the snapshot), overlap_exact %.2f",
		n, hits, hitsAfter, after, overlapExact)
	if hits != n {
		t.Errorf("%d of %d follow-ups found their prefix cached, want all", hits, n)
	}
	if overlapExact < 0.95 {
		t.Errorf("overlap_exact %.2f, want ≥ 0.95", overlapExact)
	}
}
