package scoring

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// queueRouter returns a router over one worker w0 that is saturated once
// more than 100 prefill tokens are in flight, with a 200-token request
// "blocker" already saturating it.
func queueRouter(t *testing.T, clock *fakeClock, change func(*Options)) *Scheduler {
	t.Helper()
	o := testOptions(clock, 1)
	o.QueueThreshold = 1
	change(&o)
	r, err := NewScheduler(o)
	if err != nil {
		t.Fatal(err)
	}
	s := spec("w0")
	s.MaxNumBatchedTokens = 100
	if err := r.Pool().Upsert(s); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route(t.Context(), &Request{ID: "blocker", Model: "m", PromptTokens: 200}, cands(0), nil); err != nil {
		t.Fatal(err)
	}
	return r
}

type routed struct {
	id  string
	d   Decision
	err error
}

// enqueue starts Route for req in a goroutine and waits until it is in
// the queue.
func enqueue(t *testing.T, ctx context.Context, r *Scheduler, req *Request, out chan<- routed) {
	t.Helper()
	before := r.QueueLen()
	go func() {
		d, err := r.Route(ctx, req, cands(0), nil)
		out <- routed{req.ID, d, err}
	}()
	waitFor(t, func() bool { return r.QueueLen() == before+1 }, "request "+req.ID+" queued")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func receive(t *testing.T, ch <-chan routed) routed {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for a routed request")
	}
	return routed{}
}

// Behaviour 5: queue order is correct per policy.
func TestQueueOrderPerPolicy(t *testing.T) {
	type arrival struct {
		id       string
		prompt   int
		priority float64
	}
	arrivals := []arrival{{"a", 800, 0}, {"b", 200, 0}, {"c", 800, 5}, {"d", 400, 0}}
	tests := []struct {
		policy string
		want   []string
	}{
		// Priority counts as seconds of earlier arrival (one per second).
		{"fcfs", []string{"c", "a", "b", "d"}},
		// (1+p)/uncached: c 6/800, b 1/200, d 1/400, a 1/800.
		{"wspt", []string{"c", "b", "d", "a"}},
		// Latest first, priority as seconds of later arrival: c counts as 7.
		{"lcfs", []string{"c", "d", "b", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			clock := newFakeClock()
			r := queueRouter(t, clock, func(o *Options) { o.QueuePolicy = tt.policy })
			out := make(chan routed, len(arrivals))
			for _, a := range arrivals {
				enqueue(t, t.Context(), r, &Request{ID: a.id, Model: "m", PromptTokens: a.prompt, Priority: a.priority}, out)
				clock.Advance(time.Second)
			}
			var order []string
			last := "blocker"
			for range arrivals {
				r.Pool().PrefillDone(last)
				got := receive(t, out)
				if got.err != nil {
					t.Fatalf("%s: %v", got.id, got.err)
				}
				order = append(order, got.id)
				last = got.id
				// Exactly one waiter is admitted per freed slot.
				if n := r.QueueLen(); n != len(arrivals)-len(order) {
					t.Fatalf("queue holds %d after %d admissions", n, len(order))
				}
			}
			if !slices.Equal(order, tt.want) {
				t.Errorf("%s order %v, want %v", tt.policy, order, tt.want)
			}
		})
	}
}

// Behaviour 5: shedding happens at the limits.
func TestQueueShedsAtMaxLength(t *testing.T) {
	r := queueRouter(t, newFakeClock(), func(o *Options) { o.QueueMaxLength = 2 })
	out := make(chan routed, 3)
	enqueue(t, t.Context(), r, &Request{ID: "a", Model: "m", PromptTokens: 200}, out)
	enqueue(t, t.Context(), r, &Request{ID: "b", Model: "m", PromptTokens: 200}, out)
	_, err := r.Route(t.Context(), &Request{ID: "c", Model: "m", PromptTokens: 200}, cands(0), nil)
	var shed *ShedError
	if !errors.As(err, &shed) || shed.Reason != ShedQueueFull || !errors.Is(err, ErrShed) {
		t.Fatalf("third waiter: %v, want a queue_full ShedError", err)
	}
	if r.Pool().Active("c") {
		t.Error("shed request holds load")
	}
	r.Pool().Free("blocker")
	if got := receive(t, out); got.id != "a" || got.err != nil {
		t.Errorf("after free admitted %s (%v), want a", got.id, got.err)
	}
}

func TestQueueShedsAfterMaxWait(t *testing.T) {
	r := queueRouter(t, newFakeClock(), func(o *Options) { o.QueueMaxWait = 50 * time.Millisecond })
	_, err := r.Route(t.Context(), &Request{ID: "late", Model: "m", PromptTokens: 200}, cands(0), nil)
	var shed *ShedError
	if !errors.As(err, &shed) || shed.Reason != ShedMaxWait {
		t.Fatalf("Route: %v, want a max_wait ShedError", err)
	}
	if r.QueueLen() != 0 || r.Pool().Active("late") {
		t.Errorf("shed waiter left state: queue %d, active %v", r.QueueLen(), r.Pool().Active("late"))
	}
}

func TestCancelledWaiterLeavesAtOnce(t *testing.T) {
	r := queueRouter(t, newFakeClock(), func(*Options) {})
	ctx, cancel := context.WithCancel(t.Context())
	out := make(chan routed, 2)
	enqueue(t, ctx, r, &Request{ID: "gone", Model: "m", PromptTokens: 200}, out)
	enqueue(t, t.Context(), r, &Request{ID: "next", Model: "m", PromptTokens: 200}, out)
	cancel()
	got := receive(t, out)
	if got.id != "gone" || !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled waiter returned %s %v", got.id, got.err)
	}
	if r.QueueLen() != 1 || r.Pool().Active("gone") {
		t.Errorf("after cancel: queue %d, cancelled active %v", r.QueueLen(), r.Pool().Active("gone"))
	}
	r.Pool().PrefillDone("blocker")
	if got := receive(t, out); got.id != "next" {
		t.Errorf("admitted %s, want next", got.id)
	}
}

func TestWaitersAreReexamined(t *testing.T) {
	tests := []struct {
		name    string
		release func(t *testing.T, r *Scheduler)
	}{
		{"on free", func(t *testing.T, r *Scheduler) { r.Pool().Free("blocker") }},
		{"on prefill done", func(t *testing.T, r *Scheduler) { r.Pool().PrefillDone("blocker") }},
		{"on first progress", func(t *testing.T, r *Scheduler) { r.Pool().Progress("blocker", 1) }},
		{"on an idle load report", func(t *testing.T, r *Scheduler) {
			if err := r.Pool().SetLoadReport("w0", fleet.LoadReport{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"on a new worker", func(t *testing.T, r *Scheduler) {
			if err := r.Pool().Upsert(spec("w1")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := queueRouter(t, newFakeClock(), func(*Options) {})
			out := make(chan routed, 2)
			cs := []Candidate{{Worker: "w0"}, {Worker: "w1"}}
			for _, id := range []string{"x", "y"} {
				before := r.QueueLen()
				go func() {
					d, err := r.Route(t.Context(), &Request{ID: id, Model: "m", PromptTokens: 200}, cs, nil)
					out <- routed{id, d, err}
				}()
				waitFor(t, func() bool { return r.QueueLen() == before+1 }, id+" queued")
			}
			tt.release(t, r)
			if tt.name == "on a new worker" {
				// The new worker has room (1024 tokens) for both.
				got := []string{receive(t, out).id, receive(t, out).id}
				slices.Sort(got)
				if !slices.Equal(got, []string{"x", "y"}) {
					t.Errorf("admitted %v, want x and y", got)
				}
				return
			}
			if got := receive(t, out); got.id != "x" || got.err != nil {
				t.Fatalf("admitted %s (%v), want x", got.id, got.err)
			}
			// x saturates w0 again; the same report must not admit y too.
			time.Sleep(20 * time.Millisecond)
			if r.QueueLen() != 1 {
				t.Errorf("queue holds %d, want y still waiting", r.QueueLen())
			}
		})
	}
}

func TestDisabledQueueNeverWaits(t *testing.T) {
	r := queueRouter(t, newFakeClock(), func(o *Options) { o.QueueThreshold = 0 })
	for _, id := range []string{"a", "b", "c"} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := r.Route(ctx, &Request{ID: id, Model: "m", PromptTokens: 500}, cands(0), nil)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if l := mustLoad(t, r.Pool(), "w0"); l.ActiveRequests != 4 {
		t.Errorf("active requests %d, want 4", l.ActiveRequests)
	}
}

func TestParsePriority(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"", 0, true},
		{"3", 3, true},
		{" 2.5 ", 2.5, true},
		{"-4", 0, true},
		{"1e3", 1000, true},
		{"NaN", 0, false},
		{"+Inf", 0, false},
		{"high", 0, false},
	}
	for _, tt := range tests {
		got, err := ParsePriority(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParsePriority(%q) = %g, %v; want %g, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
