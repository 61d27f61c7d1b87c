package bus

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

func TestResyncRequestReachesThePublisher(t *testing.T) {
	srv := testenv.StartNATS(t)
	worker := connect(t, srv.URL)
	var got atomic.Value
	sub, err := ServeResync(worker, "test", "w0", func(req ResyncRequest) error {
		got.Store(req)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	refuse, err := ServeResync(worker, "test", "w1", func(ResyncRequest) error { return errors.New("engine down") })
	if err != nil {
		t.Fatal(err)
	}
	defer refuse.Unsubscribe()
	if err := worker.Flush(); err != nil {
		t.Fatal(err)
	}

	router := connect(t, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := RequestResync(ctx, router, "test", "w0", ResyncRequest{Router: "r1", Reason: "stale"}); err != nil {
		t.Fatal(err)
	}
	if req, _ := got.Load().(ResyncRequest); req.Router != "r1" || req.Reason != "stale" {
		t.Fatalf("publisher saw %+v", req)
	}
	if err := RequestResync(ctx, router, "test", "w1", ResyncRequest{Router: "r1"}); err == nil {
		t.Fatal("a refusing publisher's answer was taken as success")
	}
	if err := RequestResync(ctx, router, "test", "w9", ResyncRequest{Router: "r1"}); !errors.Is(err, ErrNoResponder) {
		t.Fatalf("no publisher for w9: err %v, want ErrNoResponder", err)
	}
	// A malformed request gets a refusal, not a crash.
	msg, err := router.RequestWithContext(ctx, ResyncSubject("test", "w0"), []byte("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != `{"ok":false,"error":"request is not JSON"}` {
		t.Fatalf("reply to bad JSON: %s", msg.Data)
	}
}

func FuzzParseResyncRequest(f *testing.F) {
	for _, seed := range []string{``, `{}`, `{"router":"r1","reason":"stale"}`, `{"router":7}`, `[`, `null`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ParseResyncRequest(data)
		if err != nil && (req.Router != "" || req.Reason != "") {
			t.Fatalf("error %v with a non-empty request %+v", err, req)
		}
	})
}
