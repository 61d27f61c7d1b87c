package bus

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

func TestLoadReportsFeedThePool(t *testing.T) {
	srv := testenv.StartNATS(t)
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.StaleReportAge = 2 * time.Second
	r := newTestScheduler(t, o, 2)
	ctx, cancel := context.WithCancel(context.Background())
	a := NewLoadReports(connect(t, srv.URL), "test", r.Pool(), r.Pool().Metrics())
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pub := connect(t, srv.URL)
	send := func(subject, body string) {
		t.Helper()
		if err := pub.Publish(subject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	send(LoadSubject("test", "w1"), `{"ts_ms":1,"waiting":4,"running":7,"kv_used_blocks":600,"kv_total_blocks":1000}`)
	send(LoadSubject("test", "w0"), `{"waiting":`)                              // malformed
	send(LoadSubject("test", "w0"), `{"waiting":-1}`)                           // negative
	send(LoadSubject("test", "w0"), `{"kv_used_blocks":9,"kv_total_blocks":3}`) // impossible
	send(LoadSubject("test", "nobody"), `{"waiting":1}`)                        // unknown worker
	send("kvroute.test.load.w0.extra", `{"waiting":1}`)                         // not one worker
	send(LoadSubject("other", "w0"), `{"waiting":1}`)                           // other namespace: not seen
	waitFor(t, func() bool { return a.Accepted() == 1 && a.Rejected() == 5 }, "1 accepted, 5 rejected")

	l := mustLoad(t, r.Pool(), "w1")
	if !l.ReportFresh || l.Report.Waiting != 4 || l.Report.Running != 7 || l.KVUsedBlocks() != 600 {
		t.Errorf("w1 load after report: %+v", l)
	}
	if l := mustLoad(t, r.Pool(), "w0"); l.ReportFresh {
		t.Errorf("w0 took a bad report: %+v", l)
	}
	// The cost sees the report while fresh and ignores it once stale.
	req := &scoring.Request{ID: "r", PromptTokens: 64}
	if d, _ := r.Pick(req, cands(0, 0), nil); d.Worker != "w0" {
		t.Errorf("picked %s, want w0 (w1 reports 600 used blocks)", d.Worker)
	}
	clock.Advance(3 * time.Second)
	if l := mustLoad(t, r.Pool(), "w1"); l.ReportFresh || l.KVUsedBlocks() != 0 {
		t.Errorf("stale report still counted: %+v", l)
	}
	cancel()
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("load report adapter did not stop")
	}
}

func FuzzParseLoadReport(f *testing.F) {
	for _, seed := range []string{
		`{"ts_ms":0,"waiting":0,"running":0,"kv_used_blocks":0,"kv_total_blocks":0}`,
		`{"ts_ms":1700000000000,"waiting":3,"running":9,"kv_used_blocks":10,"kv_total_blocks":100}`,
		`{"waiting":-1}`, `{"kv_used_blocks":5,"kv_total_blocks":1}`, `{"waiting":1e99}`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseLoadReport(data)
		if err != nil {
			return
		}
		if r.Waiting < 0 || r.Running < 0 || r.KVUsedBlocks < 0 || r.KVTotalBlocks < 0 {
			t.Fatalf("accepted negative counts: %+v", r)
		}
		p := scoring.NewPool(scoring.DefaultOptions())
		if err := p.Upsert(spec("w0")); err != nil {
			t.Fatal(err)
		}
		if err := p.SetLoadReport("w0", r); err != nil {
			t.Fatal(err)
		}
	})
}

// A worker restarted under the same id (a new process, an empty cache)
// loses its old process's cache credit at its first load report, whose
// kv_event_batches went back, before its first KV event. A later batch of
// the new process applies normally; a report whose count goes up makes no
// such claim.
func TestRestartedWorkerLosesItsCreditAtItsFirstLoadReport(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc := connect(t, srv.URL)
	clock := newFakeClock()
	r := newTestScheduler(t, testOptions(clock, 1), 1)
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w0", testModel, testBS)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	core := kvevents.New(kvevents.Config{Index: ix})
	if err := core.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := SubscribeEvents(ctx, nc, "test", core); err != nil {
		t.Fatal(err)
	}
	reports := NewLoadReports(nc, "test", r.Pool(), r.Pool().Metrics())
	if err := reports.Start(ctx); err != nil {
		t.Fatal(err)
	}
	reports.FollowEvents(core)
	pub := connect(t, srv.URL)
	report := func(batches int) {
		t.Helper()
		body := `{"ts_ms":1,"kv_total_blocks":100,"kv_event_batches":` + strconv.Itoa(batches) + `}`
		if err := pub.Publish(LoadSubject("test", "w0"), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	prompt := promptHashes(1, 6)
	held := func() int { return int(ix.Match(prompt, []string{"w0"}, nil)[0].Blocks) }

	// The first process: three batches, its reports counting them.
	for seq := range 3 {
		if err := PublishEvents(pub, "test", "w0", uint64(seq), vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{storeEv(1, 2*seq, 2*seq+2)}}); err != nil {
			t.Fatal(err)
		}
	}
	report(3)
	eventually(t, "the first process's 6 blocks", func() bool { return held() == 6 })
	report(3) // the same count again: no restart
	report(4) // a claim ahead of the batches: no restart either
	eventually(t, "the three reports applied", func() bool { return reports.Accepted() == 3 })
	if got := held(); got != 6 {
		t.Fatalf("a report that did not go back dropped the view: %d blocks held", got)
	}

	// kill -9, and a new process under the same id: its reports count 0.
	report(0)
	eventually(t, "the old process's blocks dropped at the new one's first report", func() bool { return held() == 0 })
	if ix.NeedsResync("w0") {
		t.Error("the restarted worker is marked stale; its cache is known to be empty")
	}
	if got := core.Stats().Fresh; got != 1 {
		t.Errorf("fresh starts = %d, want 1", got)
	}
	// The new process's own first batch (number 0) applies.
	if err := PublishEvents(pub, "test", "w0", 0, vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{storeEv(1, 0, 2)}}); err != nil {
		t.Fatal(err)
	}
	report(1)
	eventually(t, "the new process's first batch applied", func() bool { return held() == 2 })
	if st := core.Stats(); st.Gaps != 0 || st.Fresh != 1 {
		t.Errorf("core stats %+v: want no gap and one fresh start", st)
	}
}
