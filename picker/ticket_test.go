package picker

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
)

func loadOf(t *testing.T, r *scoring.Scheduler, worker string) scoring.Load {
	t.Helper()
	l, ok := r.Pool().Load(worker)
	if !ok {
		t.Fatalf("no worker %s", worker)
	}
	return l
}

func setMode(t *testing.T, r *scoring.Scheduler, mode string) {
	t.Helper()
	if err := r.SetMode(mode); err != nil {
		t.Fatal(err)
	}
}

// A mode switch keeps the pool: a request in flight stays counted, and its
// ticket keeps reporting to the same pool.
func TestModeSwitchKeepsInFlightLoad(t *testing.T) {
	rg := newRig(t, nil)
	d, err := rg.picker.Decide(context.Background(), chatReq(longChat(50)))
	if err != nil {
		t.Fatal(err)
	}
	worker := ""
	for _, l := range rg.sched.Pool().Snapshot() {
		if l.Address == d.Address {
			worker = l.ID
		}
	}
	d.Ticket.Progress(3)

	setMode(t, rg.sched, "round_robin")
	if got := rg.picker.Scheduler().Mode().Name(); got != scoring.ModeRoundRobin {
		t.Fatalf("mode %q after the switch, want round_robin", got)
	}
	l := loadOf(t, rg.sched, worker)
	if l.ActiveRequests != 1 || l.ActiveBlocks == 0 {
		t.Fatalf("after the switch %s holds %d requests, %d blocks; want the routed one", worker, l.ActiveRequests, l.ActiveBlocks)
	}
	if l.PrefillRequests != 0 {
		t.Errorf("progress was reported, yet the pool counts %d requests in prefill", l.PrefillRequests)
	}

	setMode(t, rg.sched, "random")
	if l := loadOf(t, rg.sched, worker); l.ActiveRequests != 1 {
		t.Fatalf("second switch: %d requests on %s, want 1", l.ActiveRequests, worker)
	}
	d.Ticket.Free(extproc.OutcomeOK)
	if l := loadOf(t, rg.sched, worker); l.ActiveRequests != 0 || l.ActiveBlocks != 0 {
		t.Errorf("Free after the switch left %d requests, %d blocks", l.ActiveRequests, l.ActiveBlocks)
	}
	d.Ticket.Free(extproc.OutcomeOK) // idempotent
	if got := rg.metrics.finished[extproc.OutcomeOK]; got != 1 {
		t.Errorf("Finished counted %d times, want 1", got)
	}
}

func TestModeSwitchKeepsPrefillState(t *testing.T) {
	rg := newRig(t, nil)
	d, err := rg.picker.Decide(context.Background(), chatReq(longChat(50)))
	if err != nil {
		t.Fatal(err)
	}
	setMode(t, rg.sched, "round_robin")
	var prefill int
	for _, l := range rg.sched.Pool().Snapshot() {
		prefill += l.PrefillRequests
	}
	if prefill != 1 {
		t.Fatalf("a request still in prefill counts as %d prefill requests, want 1", prefill)
	}
	d.Ticket.PrefillDone()
	prefill = 0
	for _, l := range rg.sched.Pool().Snapshot() {
		prefill += l.PrefillRequests
	}
	if prefill != 0 {
		t.Errorf("PrefillDone after the switch did not reach the pool (%d in prefill)", prefill)
	}
	d.Ticket.Free(extproc.OutcomeReset)
}

func TestModeSwitchesDuringTrafficLeaveNoLoadBehind(t *testing.T) {
	rg := newRig(t, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			if err := rg.sched.SetMode([]string{"kv", "round_robin"}[i%2]); err != nil {
				t.Error(err)
			}
		}
	}()
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range 10 {
				d, err := rg.picker.Decide(context.Background(), chatReq(longChat(10+g*10+i)))
				if err != nil {
					errs <- err
					return
				}
				d.Ticket.PrefillDone()
				d.Ticket.Progress(1)
				d.Ticket.Free(extproc.OutcomeOK)
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	<-done
	for _, l := range rg.picker.Scheduler().Pool().Snapshot() {
		if l.ActiveRequests != 0 {
			t.Errorf("%s keeps %d requests after every response ended", l.ID, l.ActiveRequests)
		}
	}
}

// A request waiting in the admission queue stays there across a switch and
// is admitted, by the new mode, once capacity frees.
func TestModeSwitchKeepsQueuedRequests(t *testing.T) {
	rg := newRig(t, func(o *scoring.Options, _ *Config) { o.QueueThreshold, o.QueueMaxWait = 0.0001, time.Minute })
	var first []extproc.Decision
	for i := range 3 { // one request in prefill on every worker saturates them
		d, err := rg.picker.Decide(context.Background(), chatReq(longChat(20+i)))
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, d)
	}
	type result struct {
		d   extproc.Decision
		err error
	}
	waiting := make(chan result, 1)
	go func() {
		d, err := rg.picker.Decide(context.Background(), chatReq(longChat(40)))
		waiting <- result{d, err}
	}()
	// The fourth request must wait in the queue; if it was admitted, say
	// where the first three went instead of spinning forever.
	deadline := time.Now().Add(10 * time.Second)
	for rg.sched.QueueLen() != 1 {
		select {
		case res := <-waiting:
			var went []string
			for _, d := range first {
				went = append(went, d.Worker)
			}
			t.Fatalf("fourth request admitted to %q (err %v) without queueing; the first three went to %v", res.d.Worker, res.err, went)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("fourth request neither queued nor admitted after 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	setMode(t, rg.sched, "least_loaded")
	if n := rg.sched.QueueLen(); n != 1 {
		t.Fatalf("%d requests queued after the switch, want 1", n)
	}
	first[0].Ticket.PrefillDone() // capacity admits it
	select {
	case res := <-waiting:
		if res.err != nil {
			t.Fatalf("queued request failed after the switch: %v", res.err)
		}
		res.d.Ticket.Free(extproc.OutcomeOK)
	case <-time.After(10 * time.Second):
		t.Fatal("queued request still waiting after capacity freed")
	}
	for _, d := range first {
		d.Ticket.Free(extproc.OutcomeOK)
	}
}
