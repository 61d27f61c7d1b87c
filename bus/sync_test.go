package bus

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/scoring"
	"github.com/nats-io/nats.go"
)

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startSync runs replica sync for r until the test ends and checks the
// publisher goroutine stops.
func startSync(t *testing.T, nc *nats.Conn, id string, r *scoring.Scheduler) *Sync {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := NewSync(nc, "test", id, r.Pool(), r.Pool().Metrics())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-s.Done()
	})
	return s
}

// view is the part of a pool's load replicas must agree on.
func view(p *scoring.Pool) string {
	var out string
	for _, l := range p.Snapshot() {
		out += fmt.Sprintf("%s blocks=%d reqs=%d prefill=%d prefill_reqs=%d; ", l.ID, l.ActiveBlocks, l.ActiveRequests, l.PrefillTokens, l.PrefillRequests)
	}
	return out
}

func converge(t *testing.T, a, b *scoring.Pool, what string) {
	t.Helper()
	waitFor(t, func() bool { return view(a) == view(b) }, what+": views converge\n a: "+view(a)+"\n b: "+view(b))
}

// Behaviour 7: replica sync converges.
func TestReplicaSyncConverges(t *testing.T) {
	srv := testenv.StartNATS(t)
	r1 := newTestScheduler(t, testOptions(newFakeClock(), 1), 4)
	r2 := newTestScheduler(t, testOptions(newFakeClock(), 2), 4)
	s1 := startSync(t, connect(t, srv.URL), "router-1", r1)
	s2 := startSync(t, connect(t, srv.URL), "router-2", r2)

	// Both replicas route; requests share a system prompt across routers.
	for i := range 12 {
		r := r1
		if i%3 == 0 {
			r = r2
		}
		req := &scoring.Request{ID: fmt.Sprint("req", i), Model: "m", PromptTokens: 300 + 10*i, Hashes: hashes(3, 8, 10+i%5, i)}
		if _, err := r.Route(t.Context(), req, cands(8, 0, 4, 0), nil); err != nil {
			t.Fatal(err)
		}
	}
	r1.Pool().PrefillDone("req1")
	r1.Pool().Progress("req2", 70)
	r2.Pool().Progress("req3", 33)
	r1.Pool().Free("req4")
	if err := r2.Pool().Move("req6", "w3"); err != nil {
		t.Fatal(err)
	}
	converge(t, r1.Pool(), r2.Pool(), "after routing")

	// Each replica counts every request once: its own are not echoed back.
	total := 0
	for _, l := range r1.Pool().Snapshot() {
		total += l.ActiveRequests
	}
	if total != 11 {
		t.Errorf("replica 1 counts %d active requests, want 11", total)
	}

	for i := range 12 {
		r := r1
		if i%3 == 0 {
			r = r2
		}
		r.Pool().Free(fmt.Sprint("req", i))
	}
	converge(t, r1.Pool(), r2.Pool(), "after freeing")
	for _, l := range r2.Pool().Snapshot() {
		if l.ActiveBlocks != 0 || l.ActiveRequests != 0 || l.PrefillTokens != 0 {
			t.Errorf("load left after every request was freed: %+v", l)
		}
	}
	if s1.Rejected() != 0 || s2.Rejected() != 0 {
		t.Errorf("rejected sync events: %d, %d", s1.Rejected(), s2.Rejected())
	}
	if s1.Applied() == 0 || s2.Applied() == 0 {
		t.Errorf("applied sync events: %d, %d", s1.Applied(), s2.Applied())
	}
}

func TestRestartedReplicaResetsItsOldLoad(t *testing.T) {
	srv := testenv.StartNATS(t)
	r1 := newTestScheduler(t, testOptions(newFakeClock(), 1), 2)
	startSync(t, connect(t, srv.URL), "router-1", r1)

	ctx, cancel := context.WithCancel(context.Background())
	old := newTestScheduler(t, testOptions(newFakeClock(), 2), 2)
	s := NewSync(connect(t, srv.URL), "test", "router-2", old.Pool(), old.Pool().Metrics())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Route(t.Context(), &scoring.Request{ID: "x", Model: "m", PromptTokens: 64}, cands(0, 0), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return view(r1.Pool()) == view(old.Pool()) }, "peer load seen")
	cancel() // the replica dies without freeing x
	<-s.Done()

	fresh := newTestScheduler(t, testOptions(newFakeClock(), 3), 2)
	startSync(t, connect(t, srv.URL), "router-2", fresh)
	converge(t, r1.Pool(), fresh.Pool(), "after restart")
	for _, l := range r1.Pool().Snapshot() {
		if l.ActiveRequests != 0 {
			t.Errorf("restarted peer's old load kept: %+v", l)
		}
	}
}

func TestSyncRejectsBadMessages(t *testing.T) {
	srv := testenv.StartNATS(t)
	r1 := newTestScheduler(t, testOptions(newFakeClock(), 1), 1)
	s := startSync(t, connect(t, srv.URL), "router-1", r1)
	pub := connect(t, srv.URL)
	for _, msg := range []string{
		`not json`,
		`{"router":"","op":"free","id":"x"}`,
		`{"router":"p","op":"explode","id":"x"}`,
		`{"router":"p","op":"add","id":"x","worker":"w9","prompt_tokens":10}`,
		`{"router":"p","op":"add","id":"x","worker":"w0","prompt_tokens":-1}`,
	} {
		if err := pub.Publish(SyncSubject("test"), []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish(SyncSubject("test"), []byte(`{"router":"p","op":"add","id":"ok","worker":"w0","prompt_tokens":32,"prefill_tokens":32,"hashes":[1,2]}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.Rejected() == 5 && s.Applied() == 1 }, "5 rejected, 1 applied")
	if l := mustLoad(t, r1.Pool(), "w0"); l.ActiveBlocks != 2 || l.PrefillTokens != 32 {
		t.Errorf("valid peer event not applied: %+v", l)
	}
}

func FuzzParseSyncEvent(f *testing.F) {
	for _, seed := range []string{
		`{"router":"r","op":"add","id":"x","worker":"w0","prompt_tokens":32,"prefill_tokens":16,"hashes":[1,18446744073709551615]}`,
		`{"router":"r","op":"free","id":"x"}`,
		`{"router":"r","op":"reset"}`,
		`{"router":"r","op":"heartbeat","interval_ms":1000,"incarnation":"ab12"}`,
		`{"router":"r","op":"heartbeat","interval_ms":0}`,
		`{"router":"r","op":"move","id":"x","worker":"w1"}`,
		`{"router":"r","op":"progress","id":"x","output_tokens":-3}`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := ParseSyncEvent(data)
		if err != nil {
			return
		}
		// Whatever decodes must apply to a pool without panicking.
		p := scoring.NewPool(scoring.DefaultOptions())
		if err := p.Upsert(spec("w0")); err != nil {
			t.Fatal(err)
		}
		_ = p.Apply(ev)
		for _, l := range p.Snapshot() {
			if l.ActiveBlocks < 0 || l.PrefillTokens < 0 || l.ActiveRequests < 0 {
				t.Fatalf("negative load after %+v: %+v", ev, l)
			}
		}
	})
}

func TestSweptRequestsAreFreedOnPeers(t *testing.T) {
	srv := testenv.StartNATS(t)
	clock := newFakeClock()
	r1 := newTestScheduler(t, testOptions(clock, 1), 2)
	r2 := newTestScheduler(t, testOptions(newFakeClock(), 2), 2)
	startSync(t, connect(t, srv.URL), "router-1", r1)
	startSync(t, connect(t, srv.URL), "router-2", r2)
	if _, err := r1.Route(t.Context(), &scoring.Request{ID: "lost", Model: "m", PromptTokens: 64}, cands(0, 0), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return view(r2.Pool()) == view(r1.Pool()) && r2.Pool().Snapshot()[0].ActiveRequests+r2.Pool().Snapshot()[1].ActiveRequests == 1
	}, "peer sees the request")
	clock.Advance(time.Hour)
	if n := r1.Pool().Sweep(); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	converge(t, r1.Pool(), r2.Pool(), "after sweep")
	for _, l := range r2.Pool().Snapshot() {
		if l.ActiveRequests != 0 {
			t.Errorf("peer keeps a swept request: %+v", l)
		}
	}
}
