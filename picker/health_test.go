package picker

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/extproc"
)

// A worker whose index view is stale (a gap in its events) gets no credit
// for the blocks the index still shows: its overlap is unknown until it
// resyncs.
func TestStaleWorkerGetsNoOverlapCredit(t *testing.T) {
	rg := newRig(t, nil)
	body := longChat(200)
	tokens := chatTokens(t, body)
	rg.store(t, "w2", tokens, len(tokens)/16)
	rg.index.MarkStale("w2")
	x, err := rg.picker.Explain(chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range x.Decision.Workers {
		if c.Worker == "w2" && c.MatchedBlocks != 0 {
			t.Fatalf("stale w2 credited with %d matched blocks", c.MatchedBlocks)
		}
	}
	rg.index.Reset("w2")
	rg.store(t, "w2", tokens, len(tokens)/16)
	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	if d.Cluster != "w2" || d.CachedTokens == 0 {
		t.Fatalf("after the resync routed to %s with %d cached tokens, want w2 with its prefix", d.Cluster, d.CachedTokens)
	}
	d.Ticket.Free(extproc.OutcomeOK)
}

// Two 5xx outcomes on a worker eject it: the next decisions avoid it.
func TestUpstreamErrorsEjectTheWorker(t *testing.T) {
	rg := newRig(t, nil)
	body := longChat(50)
	first, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	victim := first.Cluster
	first.Ticket.Free(extproc.OutcomeUpstreamError)
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatalf("%s never chosen again in 200 decisions", victim)
		}
		d, err := rg.picker.Decide(context.Background(), chatReq(body))
		if err != nil {
			t.Fatal(err)
		}
		if d.Cluster == victim {
			d.Ticket.Free(extproc.OutcomeUpstreamError)
			break
		}
		d.Ticket.Free(extproc.OutcomeOK)
	}
	if _, ej := rg.sched.Pool().Ejected(victim); !ej {
		t.Fatalf("%s not ejected after two upstream errors", victim)
	}
	for range 10 {
		d, err := rg.picker.Decide(context.Background(), chatReq(body))
		if err != nil {
			t.Fatal(err)
		}
		if d.Cluster == victim {
			t.Fatalf("ejected %s was chosen", victim)
		}
		d.Ticket.Free(extproc.OutcomeOK)
	}
}

// A data plane that served a request from a fallback endpoint tells the
// router the primary failed: two such fallbacks eject the primary.
func TestFallbackServedCountsAgainstThePrimary(t *testing.T) {
	rg := newRig(t, nil)
	body := longChat(50)
	var primary string
	for i := 0; i < 200; i++ {
		d, err := rg.picker.Decide(context.Background(), chatReq(body))
		if err != nil {
			t.Fatal(err)
		}
		if primary == "" {
			primary = d.Cluster
		}
		if d.Cluster != primary {
			d.Ticket.Free(extproc.OutcomeOK)
			continue
		}
		d.Ticket.Served(d.Fallbacks[0])
		d.Ticket.Free(extproc.OutcomeOK)
		if _, ej := rg.sched.Pool().Ejected(primary); ej {
			return
		}
	}
	t.Fatalf("%s not ejected after its requests were served by fallbacks", primary)
}

// The fallback a data plane retries on is healthy: an ejected worker is
// never named, so a retry does not land on a worker known to be dead.
func TestFallbacksLeaveOutEjectedWorkers(t *testing.T) {
	rg := newRig(t, nil)
	body := longChat(50)
	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free(extproc.OutcomeOK)
	if len(d.Fallbacks) < 2 {
		t.Fatalf("want at least two fallbacks before the ejection, got %v", d.Fallbacks)
	}
	victim, ok := rg.sched.Pool().WorkerByAddress(d.Fallbacks[0])
	if !ok {
		t.Fatalf("fallback %s is no worker", d.Fallbacks[0])
	}
	for !rg.sched.Pool().Observe(victim, false) {
	}
	for range 20 {
		d, err := rg.picker.Decide(context.Background(), chatReq(body))
		if err != nil {
			t.Fatal(err)
		}
		d.Ticket.Free(extproc.OutcomeOK)
		if len(d.Fallbacks) == 0 {
			t.Fatal("no fallback left although healthy workers remain")
		}
		for _, f := range append([]string{d.Address}, d.Fallbacks...) {
			if w, _ := rg.sched.Pool().WorkerByAddress(f); w == victim {
				t.Fatalf("ejected %s (%s) named in %s %v", victim, f, d.Address, d.Fallbacks)
			}
		}
	}
}
