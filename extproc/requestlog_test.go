package extproc

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// memLog is a RequestLog that keeps everything, for stream tests.
type memLog struct {
	mu       sync.Mutex
	ids      []string
	decided  []Decision
	rejected []*HTTPError
	finished map[uint64]Finish
}

func (l *memLog) Decided(id string, d *Decision, rejected *HTTPError) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, id)
	if d != nil {
		l.decided = append(l.decided, *d)
	} else {
		l.decided = append(l.decided, Decision{})
	}
	l.rejected = append(l.rejected, rejected)
	return uint64(len(l.ids))
}

func (l *memLog) Finished(h uint64, end Finish) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished == nil {
		l.finished = map[uint64]Finish{}
	}
	if _, dup := l.finished[h]; dup {
		panic("Finished twice")
	}
	l.finished[h] = end
}

// stepClock advances by a fixed step on every reading.
type stepClock struct {
	t    time.Time
	step time.Duration
}

func (c *stepClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

func respWorkerHeader(t *testing.T, out []*pb.ProcessingResponse) (string, bool) {
	t.Helper()
	if len(out) != 1 || out[0].GetResponseHeaders() == nil {
		t.Fatalf("want one response_headers answer, got %v", kinds(out))
	}
	for _, h := range out[0].GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == WorkerHeader {
			return string(h.GetHeader().GetRawValue()), true
		}
	}
	return "", false
}

func TestStreamResponseWorkerHeaderOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		name   string
		on     bool
		worker string
		want   string
	}{
		{"off", false, "w0-id", ""},
		{"on, the worker's id", true, "w0-id", "w0-id"},
		{"on, no id: the cluster", true, "", "w0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet()
			f.workers[0].Worker = tc.worker
			s := NewStream(&Config{ResponseWorkerHeader: tc.on}, f)
			if _, err := s.Step(context.Background(), chatHeaders(ModeBuffered)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Step(context.Background(), reqBody(chatBody, true)); err != nil {
				t.Fatal(err)
			}
			out, err := s.Step(context.Background(), respHeaders("200", false))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := respWorkerHeader(t, out)
			if ok != (tc.want != "") || got != tc.want {
				t.Errorf("x-kvroute-worker %q (set %v), want %q", got, ok, tc.want)
			}
		})
	}
}

func TestStreamReportsDecisionAndOutcomeToTheRequestLog(t *testing.T) {
	clock := &stepClock{t: time.Unix(1000, 0), step: 10 * time.Millisecond}
	log := &memLog{}
	f := newFleet()
	f.workers[0].Worker, f.workers[0].Explanation = "w0-id", "why"
	s := NewStream(&Config{Requests: log, Now: clock.now}, f)
	msgs := []*pb.ProcessingRequest{
		chatHeaders(ModeBuffered, hdr{RequestIDHeader, "req-1"}),
		reqBody(chatBody, true),
		respHeaders("200", false),
		respBody("data: {}\n\n", false),
		respBody("data: [DONE]\n\n", true),
	}
	for _, m := range msgs {
		if _, err := s.Step(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	s.Close(nil)
	if len(log.ids) != 1 || log.ids[0] != "req-1" {
		t.Fatalf("decisions logged under %v, want [req-1]", log.ids)
	}
	if d := log.decided[0]; d.Worker != "w0-id" || d.Explanation != "why" || log.rejected[0] != nil {
		t.Errorf("logged decision %+v rejected %v", d, log.rejected[0])
	}
	end, ok := log.finished[1]
	if !ok {
		t.Fatal("no outcome logged")
	}
	// Clock readings: decision, first body byte, end, 10 ms apart.
	want := Finish{Status: 200, Outcome: OutcomeOK, TTFT: 10 * time.Millisecond, Duration: 20 * time.Millisecond}
	if end != want {
		t.Errorf("outcome %+v, want %+v", end, want)
	}
	if s.decision.Explanation != nil {
		t.Error("the stream kept the explanation after handing it to the log")
	}
}

func TestStreamLogsRejectionsAndResets(t *testing.T) {
	t.Run("rejected", func(t *testing.T) {
		log := &memLog{}
		f := newFleet()
		f.err = ErrShed("queue full")
		s := NewStream(&Config{Requests: log}, f)
		if _, err := s.Step(context.Background(), chatHeaders(ModeBuffered, hdr{RequestIDHeader, "req-2"})); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Step(context.Background(), reqBody(chatBody, true)); err != nil {
			t.Fatal(err)
		}
		s.Close(nil)
		if len(log.rejected) != 1 || log.rejected[0] == nil || log.rejected[0].Status != 429 {
			t.Fatalf("rejections logged %v, want one 429", log.rejected)
		}
		if end := log.finished[1]; end.Status != 429 || end.Outcome != OutcomeReset {
			t.Errorf("outcome %+v, want status 429", end)
		}
	})
	t.Run("client went away", func(t *testing.T) {
		log := &memLog{}
		s := NewStream(&Config{Requests: log}, newFleet())
		if _, err := s.Step(context.Background(), chatHeaders(ModeBuffered, hdr{RequestIDHeader, "req-3"})); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Step(context.Background(), reqBody(chatBody, true)); err != nil {
			t.Fatal(err)
		}
		s.Close(context.Canceled)
		if end, ok := log.finished[1]; !ok || end.Outcome != OutcomeReset || end.Status != 0 || end.TTFT != 0 {
			t.Errorf("outcome %+v (logged %v), want a reset with no status and no TTFT", end, ok)
		}
	})
}
