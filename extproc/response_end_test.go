package extproc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// With response body mode NONE, Envoy shows kvroute the response headers
// and then only the stream's end, which it closes (cleanly or by cancelling
// it) when the request ends: that end is a normal end. Before the response
// headers, or after an error status, or for a stream that failed, it is not.
func TestStreamEndAfterResponseHeadersIsTheResponseEnd(t *testing.T) {
	cancelled := status.Error(codes.Canceled, "context canceled")
	for _, tc := range []struct {
		name  string
		steps []*pb.ProcessingRequest
		err   error
		want  []Outcome
	}{
		{"cancel after 200 headers", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("200", false)}, cancelled, []Outcome{OutcomeOK}},
		{"half-close after 200 headers", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("200", false)}, io.EOF, []Outcome{OutcomeOK}},
		{"context cancel after 200 headers", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("200", false)}, context.Canceled, []Outcome{OutcomeOK}},
		{"cancel before response headers", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true)}, cancelled, []Outcome{OutcomeReset}},
		{"stream failed after 200 headers", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("200", false)}, status.Error(codes.Unavailable, "gone"), []Outcome{OutcomeReset}},
		{"idle close after 200 headers", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("200", false)}, errors.New("idle"), []Outcome{OutcomeReset}},
		{"cancel after 404 headers", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("404", false)}, cancelled, []Outcome{OutcomeErrorStatus}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet()
			s := NewStream(&Config{}, f)
			for _, m := range tc.steps {
				if _, err := s.Step(context.Background(), m); err != nil {
					t.Fatal(err)
				}
			}
			s.Close(tc.err)
			if _, _, _, frees := f.lastTicket().snapshot(); len(frees) != 1 || frees[0] != tc.want[0] {
				t.Errorf("frees %v, want %v", frees, tc.want)
			}
		})
	}
}

// After the response headers with response body NONE nothing comes until
// the request ends, however long the response takes: the idle timeout does
// not close such a stream, and Envoy's cancel at the end frees the load as
// a normal end.
func TestServerKeepsASilentResponseOpenUntilItsEnd(t *testing.T) {
	f := newFleet()
	m := &idleCounter{}
	const idle = 200 * time.Millisecond
	_, cc := startServer(t, ServerConfig{Decider: f, Metrics: m, StreamIdleTimeout: idle})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := exchangeOpen(t, ctx, cc, []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("200", false)}, 3)
	tk := f.lastTicket()
	time.Sleep(5 * idle)
	if n := m.idle.Load(); n != 0 {
		t.Fatalf("%d idle closes while the response was under way", n)
	}
	if _, _, _, frees := tk.snapshot(); len(frees) != 0 {
		t.Fatalf("load freed (%v) while the response was under way", frees)
	}
	_ = st
	cancel()
	waitFrees(t, tk, []Outcome{OutcomeOK})
}
