package extproc

import (
	"context"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A Decider that knows no worker at all ends the stream UNAVAILABLE in
// every body mode, whether it decides at the headers or after the body:
// no immediate response of the router's own, so the data plane applies
// its failure mode as if the router were down.
func TestNoFleetEndsTheStreamUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []*pb.ProcessingRequest
	}{
		{"buffered", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true)}},
		{"full duplex", []*pb.ProcessingRequest{chatHeaders(ModeFullDuplex), reqBody(chatBody, true)}},
		{"headers only", []*pb.ProcessingRequest{chatHeaders(ModeNone)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet()
			f.err = ErrNoFleet
			s := NewStream(&Config{}, f)
			var out []*pb.ProcessingResponse
			var err error
			for _, m := range tc.steps {
				if out, err = s.Step(context.Background(), m); err != nil {
					break
				}
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("err = %v, want UNAVAILABLE", err)
			}
			for _, r := range out {
				if r.GetImmediateResponse() != nil {
					t.Fatalf("the router answered itself: %v", r)
				}
			}
		})
	}
}

// The per-stream failure line goes out once per period; the lines held
// back are counted into the next one.
func TestFailedStreamLogIsRateLimited(t *testing.T) {
	l := logLimiter{every: time.Second}
	t0 := time.Unix(1_700_000_000, 0)
	if ok, n := l.allow(t0); !ok || n != 0 {
		t.Fatalf("first line: ok=%v held=%d", ok, n)
	}
	for i := range 5 {
		if ok, _ := l.allow(t0.Add(time.Duration(i) * 100 * time.Millisecond)); ok {
			t.Fatalf("line %d within the period went out", i)
		}
	}
	if ok, n := l.allow(t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("after the period: ok=%v held=%d, want true and 5", ok, n)
	}
}
