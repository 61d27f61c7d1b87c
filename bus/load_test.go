package bus

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/scoring"
)

func TestLoadReportsFeedThePool(t *testing.T) {
	srv := testenv.StartNATS(t)
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.StaleReportAge = 2 * time.Second
	r := newTestScheduler(t, o, 2)
	ctx, cancel := context.WithCancel(context.Background())
	a := NewLoadReports(connect(t, srv.URL), "test", r.Pool())
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
