package bus

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/scoring"
)

// settableClock is a clock for the sync adapter's peer expiry.
type settableClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *settableClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *settableClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func activeRequests(p *scoring.Pool) int {
	n := 0
	for _, l := range p.Snapshot() {
		n += l.ActiveRequests
	}
	return n
}

// A peer that stops sending heartbeats has its load dropped once three of
// its heartbeat periods pass without one, and not before. The peer is a
// raw NATS publisher, so the periods are counted on a clock the test sets.
func TestSilentPeerLoadDroppedAfterThreeMissedHeartbeats(t *testing.T) {
	srv := testenv.StartNATS(t)
	r1 := newTestScheduler(t, testOptions(newFakeClock(), 1), 2)
	clock := &settableClock{t: time.Unix(1_700_000_000, 0)}
	s := NewSync(connect(t, srv.URL), "test", "router-1", r1.Pool(), r1.Pool().Metrics())
	s.now = clock.Now
	s.SetHeartbeat(time.Hour) // the test drives expiry itself
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-s.Done() })

	pub := connect(t, srv.URL)
	for _, msg := range []string{
		`{"router":"dead","op":"heartbeat","interval_ms":500,"incarnation":"a"}`,
		`{"router":"dead","op":"add","id":"x","worker":"w0","prompt_tokens":64,"prefill_tokens":64}`,
		`{"router":"dead","op":"add","id":"y","worker":"w1","prompt_tokens":64,"prefill_tokens":64}`,
	} {
		if err := pub.Publish(SyncSubject("test"), []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return activeRequests(r1.Pool()) == 2 }, "the peer's two requests applied")
	if s.expirePeers() != 0 {
		t.Fatal("a peer just heard from was expired")
	}
	clock.Advance(3 * 500 * time.Millisecond)
	if s.expirePeers() != 0 || activeRequests(r1.Pool()) != 2 {
		t.Fatal("peer dropped after exactly 3 heartbeat periods, before the third was missed")
	}
	clock.Advance(time.Millisecond)
	if s.expirePeers() != 1 {
		t.Fatal("peer not expired after 3 missed heartbeats")
	}
	if n := activeRequests(r1.Pool()); n != 0 {
		t.Fatalf("%d phantom requests left after the peer expired", n)
	}
	if len(s.Peers()) != 0 {
		t.Fatalf("peers %v, want none", s.Peers())
	}
}

// With real heartbeats: a replica that dies (its sync stops, nothing freed)
// stops weighing on its workers at its peer within a few periods.
func TestDeadReplicaLoadExpiresAtPeers(t *testing.T) {
	srv := testenv.StartNATS(t)
	const period = 100 * time.Millisecond
	r1 := newTestScheduler(t, testOptions(newFakeClock(), 1), 2)
	s1 := NewSync(connect(t, srv.URL), "test", "router-1", r1.Pool(), r1.Pool().Metrics())
	s1.SetHeartbeat(period)
	ctx1, cancel1 := context.WithCancel(context.Background())
	if err := s1.Start(ctx1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel1(); <-s1.Done() })

	r2 := newTestScheduler(t, testOptions(newFakeClock(), 2), 2)
	s2 := NewSync(connect(t, srv.URL), "test", "router-2", r2.Pool(), r2.Pool().Metrics())
	s2.SetHeartbeat(period)
	ctx2, cancel2 := context.WithCancel(context.Background())
	if err := s2.Start(ctx2); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := r2.Route(t.Context(), &scoring.Request{ID: id, Model: "m", PromptTokens: 64}, cands(0, 0), nil); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return activeRequests(r1.Pool()) == 3 }, "the peer's load seen")
	// Heartbeats alone keep the peer alive well past three periods.
	waitFor(t, func() bool {
		s1.mu.Lock()
		defer s1.mu.Unlock()
		p := s1.peers["router-2"]
		return p != nil && p.interval == period
	}, "the peer's heartbeat period learned")
	cancel2()
	<-s2.Done()
	died := time.Now()
	waitFor(t, func() bool { return activeRequests(r1.Pool()) == 0 }, "the dead peer's load dropped")
	t.Logf("dead peer's load dropped %v after it stopped (heartbeat %v)", time.Since(died).Round(time.Millisecond), period)
}

// A worker's own load report with nothing running clears the requests a
// peer left on it (a lost Free), but not requests younger than a second.
func TestIdleLoadReportClearsPeerPhantoms(t *testing.T) {
	clock := newFakeClock()
	r := newTestScheduler(t, testOptions(clock, 1), 2)
	p := r.Pool()
	for _, ev := range []fleet.SyncEvent{
		{Router: "peer", Op: fleet.OpAdd, ID: "old", Worker: "w0", PromptTokens: 64, PrefillTokens: 64},
	} {
		if err := p.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Route(t.Context(), &scoring.Request{ID: "local", Model: "m", PromptTokens: 64}, []scoring.Candidate{{Worker: "w0"}}, nil); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	if err := p.Apply(fleet.SyncEvent{Router: "peer", Op: fleet.OpAdd, ID: "young", Worker: "w0", PromptTokens: 64, PrefillTokens: 64}); err != nil {
		t.Fatal(err)
	}
	if err := p.SetLoadReport("w0", fleet.LoadReport{Running: 1, KVTotalBlocks: 100}); err != nil {
		t.Fatal(err)
	}
	if n := mustLoad(t, p, "w0").ActiveRequests; n != 3 {
		t.Fatalf("a busy report changed the requests: %d, want 3", n)
	}
	if err := p.SetLoadReport("w0", fleet.LoadReport{KVTotalBlocks: 100}); err != nil {
		t.Fatal(err)
	}
	if n := mustLoad(t, p, "w0").ActiveRequests; n != 2 {
		t.Fatalf("after an idle report %d requests, want 2 (the local one and the young peer one)", n)
	}
	if !p.Active("local") {
		t.Fatal("the local request was cleared")
	}
}
