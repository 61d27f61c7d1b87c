package scoring

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// pickN routes n fresh requests and counts the picks per worker.
func pickN(t *testing.T, r *Scheduler, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		var cands []Candidate
		cands = r.Pool().AppendCandidates(cands, "m")
		d, err := r.Pick(&Request{Model: "m", PromptTokens: 64}, cands, nil)
		if err != nil {
			t.Fatal(err)
		}
		got[d.Worker]++
	}
	return got
}

func TestConsecutiveFailuresEjectWorkerForBackoff(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.EjectAfter, o.EjectBackoff, o.EjectBackoffMax = 2, time.Second, 3*time.Second
	r := newTestScheduler(t, o, 2)
	p := r.Pool()
	if p.Observe("w0", false) {
		t.Fatal("one failure ejected w0, want EjectAfter=2")
	}
	if !p.Observe("w0", false) {
		t.Fatal("two consecutive failures did not eject w0")
	}
	if got := pickN(t, r, 20); got["w0"] != 0 {
		t.Fatalf("ejected w0 was picked %d of 20 times", got["w0"])
	}
	if l := mustLoad(t, p, "w0"); !l.Ejected {
		t.Error("Load.Ejected not set for an ejected worker")
	}
	clock.Advance(time.Second + time.Millisecond)
	if _, ej := p.Ejected("w0"); ej {
		t.Fatal("w0 still ejected after its back-off")
	}
	// Failing again without a success doubles the back-off.
	p.Observe("w0", false)
	p.Observe("w0", false)
	until, ej := p.Ejected("w0")
	if !ej || until.Sub(clock.Now()) != 2*time.Second {
		t.Fatalf("second ejection until %v (ejected %v), want 2s from now", until.Sub(clock.Now()), ej)
	}
	clock.Advance(2*time.Second + time.Millisecond)
	p.Observe("w0", false)
	p.Observe("w0", false)
	if until, _ := p.Ejected("w0"); until.Sub(clock.Now()) != 3*time.Second {
		t.Fatalf("third ejection lasts %v, want the 3s cap", until.Sub(clock.Now()))
	}
	// A success resets both counters: the next ejection is the short one.
	clock.Advance(4 * time.Second)
	p.Observe("w0", true)
	p.Observe("w0", false)
	p.Observe("w0", true)
	if p.Observe("w0", false) {
		t.Fatal("failures separated by a success ejected the worker")
	}
	p.Observe("w0", false)
	if until, _ := p.Ejected("w0"); until.Sub(clock.Now()) != time.Second {
		t.Fatalf("ejection after a success lasts %v, want the base 1s", until.Sub(clock.Now()))
	}
}

func TestAllEjectedFailsOpenByLoad(t *testing.T) {
	clock := newFakeClock()
	r := newTestScheduler(t, testOptions(clock, 2), 2)
	p := r.Pool()
	for _, id := range []string{"w0", "w1"} {
		p.Observe(id, false)
		p.Observe(id, false)
	}
	if err := p.Add(&Request{ID: "busy", Model: "m", PromptTokens: 4096}, "w0", 0); err != nil {
		t.Fatal(err)
	}
	if got := pickN(t, r, 10); got["w1"] != 10 {
		t.Fatalf("with every worker ejected, picks %v, want all on the less loaded w1", got)
	}
}

func TestEjectionFreesRequestsInFlight(t *testing.T) {
	clock := newFakeClock()
	r := newTestScheduler(t, testOptions(clock, 3), 2)
	p := r.Pool()
	var sunk []fleet.SyncEvent
	p.SetSink(func(ev fleet.SyncEvent) { sunk = append(sunk, ev) })
	for _, id := range []string{"a", "b"} {
		if err := p.Add(&Request{ID: id, Model: "m", PromptTokens: 100, Hashes: hashes(1, 4, 2, 0)}, "w0", 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Apply(fleet.SyncEvent{Router: "peer", Op: fleet.OpAdd, ID: "x", Worker: "w0", PromptTokens: 50}); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(&Request{ID: "c", Model: "m", PromptTokens: 100}, "w1", 0); err != nil {
		t.Fatal(err)
	}
	sunk = nil
	p.Observe("w0", false)
	p.Observe("w0", false)
	l := mustLoad(t, p, "w0")
	if l.ActiveRequests != 0 || l.ActiveBlocks != 0 || l.PrefillTokens != 0 {
		t.Fatalf("ejected w0 keeps load %+v", l)
	}
	if p.Active("a") || p.Active("b") || !p.Active("c") {
		t.Fatalf("active a=%v b=%v c=%v, want only c", p.Active("a"), p.Active("b"), p.Active("c"))
	}
	frees := 0
	for _, ev := range sunk {
		if ev.Op == fleet.OpFree {
			frees++
		}
	}
	if frees != 2 {
		t.Fatalf("peers told of %d frees, want 2 (the local requests only): %+v", frees, sunk)
	}
	// A late Free from the stream is harmless.
	p.Free("a")
	if l := mustLoad(t, p, "w1"); l.ActiveRequests != 1 {
		t.Fatalf("w1 has %d requests, want 1", l.ActiveRequests)
	}
}

func TestSilentWorkerIsAvoided(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 4)
	r := newTestScheduler(t, o, 2)
	p := r.Pool()
	for _, id := range []string{"w0", "w1"} {
		if err := p.SetLoadReport(id, fleet.LoadReport{KVTotalBlocks: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	// w1 is busy by the router's count; w0 then goes silent, looking idle.
	if err := p.Add(&Request{ID: "busy", Model: "m", PromptTokens: 4096}, "w1", 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(o.StaleReportAge + time.Millisecond)
	if err := p.SetLoadReport("w1", fleet.LoadReport{Running: 1, KVTotalBlocks: 1000}); err != nil {
		t.Fatal(err)
	}
	if got := pickN(t, r, 10); got["w1"] != 10 {
		t.Fatalf("picks %v, want every pick on w1, the worker still reporting", got)
	}
	if l := mustLoad(t, p, "w0"); !l.ReportSilent {
		t.Error("Load.ReportSilent not set for w0")
	}
	// A worker that never reported (no load reports in this fleet) is not
	// silent.
	if err := p.Upsert(spec("w2")); err != nil {
		t.Fatal(err)
	}
	if got := pickN(t, r, 10); got["w2"] != 10 {
		t.Fatalf("picks %v, want the idle never-reporting w2", got)
	}
}

func TestPassiveHealthOff(t *testing.T) {
	o := testOptions(newFakeClock(), 5)
	o.EjectAfter = -1
	r := newTestScheduler(t, o, 1)
	for range 10 {
		if r.Pool().Observe("w0", false) {
			t.Fatal("ejected with passive health off")
		}
	}
}

// ejections records what a HealthObserver hears.
type ejections struct {
	NopMetrics
	got []Ejection
}

func (e *ejections) WorkerEjected(ej Ejection) { e.got = append(e.got, ej) }

// An ejection is reported with its worker, cause, count and length, so the
// router can say in its log what only a counter said before.
func TestEjectionIsReportedToTheHealthObserver(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.EjectAfter, o.EjectBackoff, o.EjectBackoffMax = 2, time.Second, 3*time.Second
	seen := &ejections{}
	o.Metrics = seen
	p := newTestScheduler(t, o, 2).Pool()
	p.ObserveFailure("w0", "5xx")
	p.ObserveFailure("w0", "connect failure")
	p.ObserveFailure("w0", "connect failure")
	p.ObserveFailure("w0", "connect failure")
	want := []Ejection{
		{Worker: "w0", Reason: "connect failure", Failures: 2, Ejections: 1, Backoff: time.Second, Until: clock.Now().Add(time.Second)},
		{Worker: "w0", Reason: "connect failure", Failures: 2, Ejections: 2, Backoff: 2 * time.Second, Until: clock.Now().Add(2 * time.Second)},
	}
	if len(seen.got) != len(want) {
		t.Fatalf("observer heard %+v, want %+v", seen.got, want)
	}
	for i := range want {
		if seen.got[i] != want[i] {
			t.Errorf("ejection %d: %+v, want %+v", i, seen.got[i], want[i])
		}
	}
}
