package bus

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// SubscribeEvents delivers the namespace's batches, each with the worker
// its subject names and the number its header carries; other namespaces
// are not delivered, garbage is counted by the core and the stream goes
// on. (The sequencing rules themselves: kvevents.)
func TestSubscribeEventsDeliversTheNamespacesBatches(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker("w0", testModel, testBS)
	ix.AddWorker("w1", testModel, testBS)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	core := kvevents.New(kvevents.Config{Index: ix})
	if err := core.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := SubscribeEvents(ctx, nc, "prod", core); err != nil {
		t.Fatal(err)
	}
	prompt := promptHashes(1, 6)
	match := func(w string) kvindex.MatchResult { return ix.Match(prompt, []string{w}, nil)[0] }
	pub := func(ns, w string, seq uint64, evs ...vllmwire.Event) {
		t.Helper()
		if err := PublishEvents(nc, ns, w, seq, vllmwire.EventBatch{TS: 1, Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	pub("prod", "w0", 0, storeEv(1, 0, 2))
	pub("staging", "w0", 1, vllmwire.AllBlocksCleared{}) // not ours
	if err := nc.PublishMsg(&nats.Msg{Subject: EventsSubject("prod", "w0"), Header: nats.Header{SeqHeader: {"1"}}, Data: []byte{0xc1}}); err != nil {
		t.Fatal(err)
	}
	// No header: applied unchecked.
	data, err := vllmwire.EncodeBatch(vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{storeEv(1, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(EventsSubject("prod", "w1"), data); err != nil {
		t.Fatal(err)
	}
	pub("prod", "w0", 2, storeEv(1, 2, 4))
	eventually(t, "w0 to hold 4 blocks and w1 one", func() bool { return match("w0").Blocks == 4 && match("w1").Blocks == 1 })
	st := core.Stats()
	if st.Batches != 4 || st.DecodeErrors != 1 || st.Applied != 3 || st.Gaps != 0 {
		t.Fatalf("core stats = %+v: want the namespace's four batches, the garbage counted and no gap", st)
	}
	if ix.NeedsResync("w0") {
		t.Fatal("the other namespace's AllBlocksCleared or the garbage touched w0")
	}
}

// FuzzEventDelivery: any message on the events subjects becomes a delivery
// without panicking; the worker is what follows the prefix, and a header
// that is not a decimal number leaves the batch unnumbered.
func FuzzEventDelivery(f *testing.F) {
	f.Add("kvroute.prod.events.w0", "7", []byte{0x93})
	f.Add("kvroute.prod.events.", "", []byte{})
	f.Add("kvroute.other.events.w0", "-1", []byte{0xc1})
	f.Add("kvroute.prod.events.w0", "18446744073709551616", []byte(nil))
	prefix := "kvroute.prod.events."
	f.Fuzz(func(t *testing.T, subject, seq string, data []byte) {
		d := eventDelivery(prefix, &nats.Msg{Subject: subject, Header: nats.Header{SeqHeader: {seq}}, Data: data})
		if w, ok := strings.CutPrefix(subject, prefix); (ok && d.Worker != w) || (!ok && d.Worker != "") {
			t.Fatalf("subject %q gave worker %q", subject, d.Worker)
		}
		n, err := strconv.ParseUint(seq, 10, 64)
		if d.NoSeq != (err != nil) || (err == nil && d.Seq != n) {
			t.Fatalf("header %q gave seq %d, unnumbered %v", seq, d.Seq, d.NoSeq)
		}
	})
}
