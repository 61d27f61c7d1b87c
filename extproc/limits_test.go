package extproc

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type idleCounter struct {
	nopMetrics
	idle atomic.Int64
}

func (m *idleCounter) StreamIdle() { m.idle.Add(1) }

// A stream that sends nothing (none at all, or nothing after its request
// was routed) is closed by the idle timeout with DeadlineExceeded, frees
// its load and is counted; a stream that keeps talking is not.
func TestServerClosesIdleStreams(t *testing.T) {
	f := newFleet()
	m := &idleCounter{}
	const idle = 300 * time.Millisecond
	_, cc := startServer(t, ServerConfig{Decider: f, Metrics: m, StreamIdleTimeout: idle})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Silent from the start: never sends its request headers.
	silent, err := pb.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := silent.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("silent stream ended with %v, want DeadlineExceeded", err)
	}

	// Routed, then silent while "the upstream answers".
	st, _ := exchangeOpen(t, ctx, cc, []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true)}, 2)
	tk := f.lastTicket()
	if _, err := st.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("idle routed stream ended with %v, want DeadlineExceeded", err)
	}
	waitFrees(t, tk, []Outcome{OutcomeReset})
	if n := m.idle.Load(); n != 2 {
		t.Errorf("idle closes counted %d, want 2", n)
	}

	// A stream whose messages come more often than the timeout stays up
	// for longer than the timeout in all. The gaps leave the timeout a wide
	// margin (1.6 s) so a loaded machine does not close it.
	const longIdle = 2 * time.Second
	_, cc2 := startServer(t, ServerConfig{Decider: f, Metrics: m, StreamIdleTimeout: longIdle})
	st, _ = exchangeOpen(t, ctx, cc2, []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true)}, 2)
	msgs := []*pb.ProcessingRequest{respHeaders("200", false)}
	for range 6 {
		msgs = append(msgs, respBody("data: {}\n\n", false))
	}
	msgs = append(msgs, respBody("data: [DONE]\n\n", true))
	for i, msg := range msgs {
		time.Sleep(longIdle / 5)
		if err := st.Send(msg); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("a talking stream was closed after %d messages: %v", i, err)
		}
	}
	if n := m.idle.Load(); n != 2 {
		t.Errorf("idle closes counted %d after a talking stream, want still 2", n)
	}
}

// Routing header values are checked where they are set: a decision whose
// cluster or address holds CR/LF, NUL, spaces or other control bytes is
// refused with 502 (its load freed) instead of reaching Envoy, and bad
// fallbacks are dropped.
func TestStreamRefusesInvalidHeaderValues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		d         Decision
		status    int
		fallbacks int
	}{
		{"CRLF in cluster", Decision{Cluster: "w0\r\nx-target-worker: kvroute", Address: "10.0.0.1:8000"}, 502, 0},
		{"NUL in address", Decision{Cluster: "w0", Address: "10.0.0.1:8000\x00"}, 502, 0},
		{"space in cluster", Decision{Cluster: "w 0", Address: "10.0.0.1:8000"}, 502, 0},
		{"non-ASCII in cluster", Decision{Cluster: "wö", Address: "10.0.0.1:8000"}, 502, 0},
		{"empty address", Decision{Cluster: "w0"}, 502, 0},
		{"bad fallbacks dropped", Decision{Cluster: "w0", Address: "10.0.0.1:8000",
			Fallbacks: []string{"10.0.0.2:8000", "10.0.0.3:8000\n", "a,b", "10.0.0.4:8000"}}, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet()
			f.workers = []Decision{tc.d}
			s := NewStream(&Config{}, f)
			if _, err := s.Step(context.Background(), chatHeaders(ModeBuffered)); err != nil {
				t.Fatal(err)
			}
			out, err := s.Step(context.Background(), reqBody(chatBody, true))
			if err != nil {
				t.Fatal(err)
			}
			if tc.status != 0 {
				ir := out[0].GetImmediateResponse()
				if ir == nil || int(ir.GetStatus().GetCode()) != tc.status || !strings.Contains(string(ir.GetBody()), "invalid_route") {
					t.Fatalf("response %v, want an immediate %d invalid_route", out, tc.status)
				}
				if _, _, _, frees := f.tickets[0].snapshot(); len(frees) != 1 {
					t.Errorf("refused decision's load freed %d times, want once", len(frees))
				}
				return
			}
			var dest string
			for _, h := range out[0].GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == DestinationHeader {
					dest = string(h.GetHeader().GetRawValue())
				}
			}
			if got := strings.Count(dest, ","); got != tc.fallbacks || strings.ContainsAny(dest, "\r\n") {
				t.Errorf("destination %q: %d fallbacks, want %d valid ones", dest, got, tc.fallbacks)
			}
		})
	}
}
