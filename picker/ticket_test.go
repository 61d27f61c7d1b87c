package picker

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
)

// copyFleet builds a router in mode with the same workers as from.
func copyFleet(t *testing.T, from *scoring.Scheduler, mode string) *scoring.Scheduler {
	t.Helper()
	opts := scoring.DefaultOptions()
	opts.Mode = mode
	r, err := scoring.NewScheduler(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range from.Pool().Snapshot() {
		spec, _ := from.Pool().Spec(l.ID)
		if err := r.Pool().Upsert(spec); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func loadOf(t *testing.T, r *scoring.Scheduler, worker string) scoring.Load {
	t.Helper()
	l, ok := r.Pool().Load(worker)
	if !ok {
		t.Fatalf("no worker %s", worker)
	}
	return l
}

func TestRouterSwapCarriesInFlightLoad(t *testing.T) {
	rg := newRig(t, nil)
	d, err := rg.picker.Decide(context.Background(), chatReq(longChat(50)))
	if err != nil {
		t.Fatal(err)
	}
	worker := ""
	for _, l := range rg.router.Pool().Snapshot() {
		if l.Address == d.Address {
			worker = l.ID
		}
	}
	d.Ticket.Progress(3)

	next := copyFleet(t, rg.router, "round_robin")
	rg.picker.SetRouter(next)
	if got := rg.picker.Scheduler(); got != next {
		t.Fatal("SetRouter did not make the new router current")
	}
	l := loadOf(t, next, worker)
	if l.ActiveRequests != 1 || l.ActiveBlocks == 0 {
		t.Fatalf("after the swap %s holds %d requests, %d blocks; want the routed one", worker, l.ActiveRequests, l.ActiveBlocks)
	}
	if l.PrefillRequests != 0 {
		t.Errorf("progress was reported, yet the new pool counts %d requests in prefill", l.PrefillRequests)
	}

	third := copyFleet(t, rg.router, "random")
	rg.picker.SetRouter(third)
	if l := loadOf(t, third, worker); l.ActiveRequests != 1 {
		t.Fatalf("second swap: %d requests on %s, want 1", l.ActiveRequests, worker)
	}
	d.Ticket.Free(extproc.OutcomeOK)
	if l := loadOf(t, third, worker); l.ActiveRequests != 0 || l.ActiveBlocks != 0 {
		t.Errorf("Free after the swap left %d requests, %d blocks on the current pool", l.ActiveRequests, l.ActiveBlocks)
	}
	if n := rg.picker.inflight.len(); n != 0 {
		t.Errorf("%d requests still in flight after Free", n)
	}
	d.Ticket.Free(extproc.OutcomeOK) // idempotent
	if got := rg.metrics.finished[extproc.OutcomeOK]; got != 1 {
		t.Errorf("Finished counted %d times, want 1", got)
	}
}

func TestRouterSwapKeepsPrefillState(t *testing.T) {
	rg := newRig(t, nil)
	d, err := rg.picker.Decide(context.Background(), chatReq(longChat(50)))
	if err != nil {
		t.Fatal(err)
	}
	next := copyFleet(t, rg.router, "kv")
	rg.picker.SetRouter(next)
	var prefill int
	for _, l := range next.Pool().Snapshot() {
		prefill += l.PrefillRequests
	}
	if prefill != 1 {
		t.Fatalf("a request still in prefill moved as %d prefill requests, want 1", prefill)
	}
	d.Ticket.PrefillDone()
	prefill = 0
	for _, l := range next.Pool().Snapshot() {
		prefill += l.PrefillRequests
	}
	if prefill != 0 {
		t.Errorf("PrefillDone after the swap did not reach the new pool (%d in prefill)", prefill)
	}
	d.Ticket.Free(extproc.OutcomeReset)
}

func TestRouterSwapsDuringTrafficLeaveNoLoadBehind(t *testing.T) {
	rg := newRig(t, nil)
	// Each swap brings a fresh router, as a mode switch does.
	routers := make([]*scoring.Scheduler, 20)
	for i := range routers {
		routers[i] = copyFleet(t, rg.router, []string{"kv", "round_robin"}[i%2])
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, r := range routers {
			rg.picker.SetRouter(r)
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
	// Retired pools are dropped with their core; the current one must be
	// empty.
	for _, l := range rg.picker.Scheduler().Pool().Snapshot() {
		if l.ActiveRequests != 0 {
			t.Errorf("%s keeps %d requests after every response ended", l.ID, l.ActiveRequests)
		}
	}
	if n := rg.picker.inflight.len(); n != 0 {
		t.Errorf("%d requests in flight", n)
	}
}

func TestRouterSwapMovesQueuedRequestsToTheNewRouter(t *testing.T) {
	tune := func(o *scoring.Options) { o.QueueThreshold, o.QueueMaxWait = 0.0001, time.Minute }
	rg := newRig(t, func(o *scoring.Options, _ *Config) { tune(o) })
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
	for rg.router.QueueLen() != 1 {
		time.Sleep(time.Millisecond)
	}

	opts := scoring.DefaultOptions()
	tune(&opts)
	next, err := scoring.NewScheduler(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rg.router.Pool().Snapshot() {
		spec, _ := rg.router.Pool().Spec(l.ID)
		if err := next.Pool().Upsert(spec); err != nil {
			t.Fatal(err)
		}
	}
	rg.picker.SetRouter(next)
	deadline := time.Now().Add(10 * time.Second)
	for next.QueueLen() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the queued request did not move to the new router's queue")
		}
		time.Sleep(time.Millisecond)
	}
	first[0].Ticket.PrefillDone() // capacity on the new pool admits it
	select {
	case res := <-waiting:
		if res.err != nil {
			t.Fatalf("queued request failed after the swap: %v", res.err)
		}
		res.d.Ticket.Free(extproc.OutcomeOK)
	case <-time.After(10 * time.Second):
		t.Fatal("queued request still waiting after capacity freed on the new router")
	}
	for _, d := range first {
		d.Ticket.Free(extproc.OutcomeOK)
	}
}
