package bus

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestSnapshotMetaRoundTrip(t *testing.T) {
	in := SnapshotMeta{StreamSeq: 1<<40 + 7, Version: 1, Router: "kvroute-7f9c", TakenAt: time.Date(2026, 11, 24, 6, 0, 0, 123, time.UTC)}
	got, err := ParseSnapshotMeta(in.Metadata())
	if err != nil {
		t.Fatal(err)
	}
	if got != in {
		t.Fatalf("round trip %+v, want %+v", got, in)
	}
}

func TestParseSnapshotMetaRefusesBadMetadata(t *testing.T) {
	for name, md := range map[string]map[string]string{
		"empty":            {},
		"no version":       {metaStreamSeq: "5"},
		"negative seq":     {metaStreamSeq: "-1", metaVersion: "1"},
		"hex seq":          {metaStreamSeq: "0x10", metaVersion: "1"},
		"seq overflow":     {metaStreamSeq: "18446744073709551616", metaVersion: "1"},
		"version overflow": {metaStreamSeq: "1", metaVersion: "65536"},
	} {
		if _, err := ParseSnapshotMeta(md); !errors.Is(err, ErrSnapshotMeta) {
			t.Errorf("%s: %v, want ErrSnapshotMeta", name, err)
		}
	}
}

func FuzzParseSnapshotMeta(f *testing.F) {
	f.Add("12", "1", "r1", "2026-11-24T06:00:00Z")
	f.Add("", "", "", "")
	f.Add("18446744073709551615", "65535", strings.Repeat("x", 300), "not a time")
	f.Fuzz(func(t *testing.T, seq, version, router, taken string) {
		m, err := ParseSnapshotMeta(map[string]string{metaStreamSeq: seq, metaVersion: version, metaRouter: router, metaTakenAt: taken})
		if err != nil {
			if !errors.Is(err, ErrSnapshotMeta) {
				t.Fatalf("error %v does not wrap ErrSnapshotMeta", err)
			}
			return
		}
		if len(m.Router) > 256 {
			t.Fatalf("router of %d bytes kept", len(m.Router))
		}
		again, err := ParseSnapshotMeta(m.Metadata())
		if err != nil || again.StreamSeq != m.StreamSeq || again.Version != m.Version || again.Router != m.Router {
			t.Fatalf("re-encoded %+v parses as %+v, %v", m, again, err)
		}
	})
}

// startJetStream starts an embedded NATS server with JetStream and returns
// a JetStream handle on a connection closed when the test ends.
func startJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	n := testenv.StartJetStream(t)
	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// A stream of the operator's that already captures kvroute's event subjects
// makes EnsureEventStream fail with an error that names that stream and
// says what to do, and the stream is left as it was.
func TestEnsureEventStreamNamesAStreamThatTakesItsSubjects(t *testing.T) {
	js := startJetStream(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "AUDIT", Subjects: []string{"kvroute.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err := EnsureEventStream(ctx, js, "prod", EventStreamLimits{MaxAge: time.Hour})
	if !errors.Is(err, ErrEventSubjectsTaken) || !strings.Contains(err.Error(), `"AUDIT"`) || !strings.Contains(err.Error(), "kvroute.prod.events.>") {
		t.Fatalf("EnsureEventStream beside a stream on kvroute.>: %v, want ErrEventSubjectsTaken naming AUDIT and the subjects", err)
	}
	if info, err := js.Stream(ctx, "AUDIT"); err != nil || info.CachedInfo().Config.Subjects[0] != "kvroute.>" {
		t.Fatalf("the operator's stream was changed: %v", err)
	}
}

// Replicas write their own snapshot objects; Newest returns the one
// covering the highest stream sequence whoever wrote it, and a write
// deletes only snapshots it supersedes.
func TestSnapshotStoreNewestWins(t *testing.T) {
	js := startJetStream(t)
	ctx := context.Background()
	store, err := OpenSnapshotStore(ctx, js, "ns1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := store.Newest(ctx); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("empty bucket: %v, want ErrNoSnapshot", err)
	}
	put := func(router string, seq uint64) {
		t.Helper()
		if err := store.Put(ctx, SnapshotMeta{StreamSeq: seq, Version: 1, Router: router, TakenAt: time.Now()}, []byte(router)); err != nil {
			t.Fatal(err)
		}
	}
	newest := func() (string, uint64) {
		t.Helper()
		m, _, body, err := store.Newest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer body.Close()
		b, err := io.ReadAll(body)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != m.Router {
			t.Fatalf("body %q under %q's metadata", b, m.Router)
		}
		return m.Router, m.StreamSeq
	}
	put("a", 5)
	put("b", 3) // a late writer behind a: a stays newest
	if r, seq := newest(); r != "a" || seq != 5 {
		t.Fatalf("newest %s@%d, want a@5", r, seq)
	}
	put("b", 9)
	if r, seq := newest(); r != "b" || seq != 9 {
		t.Fatalf("newest %s@%d, want b@9", r, seq)
	}
	infos, err := store.list(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].name != "snapshot.b" {
		t.Fatalf("bucket holds %+v, want only b's snapshot (a's superseded)", infos)
	}
}
