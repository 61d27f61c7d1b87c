package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func immediateOf(t *testing.T, out []*pb.ProcessingResponse) (int, openAIError) {
	t.Helper()
	if len(out) != 1 {
		t.Fatalf("responses %v, want one immediate", kinds(out))
	}
	ir := out[0].GetImmediateResponse()
	if ir == nil {
		t.Fatalf("response %v is not immediate", kinds(out))
	}
	var e openAIError
	if err := json.Unmarshal(ir.GetBody(), &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", ir.GetBody(), err)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Errorf("error body %s lacks message/type/code", ir.GetBody())
	}
	if ct := headerOf(ir.GetHeaders(), "content-type"); ct != "application/json" {
		t.Errorf("content-type %q", ct)
	}
	return int(ir.GetStatus().GetCode()), e
}

func headerOf(m *pb.HeaderMutation, name string) string {
	for _, h := range m.GetSetHeaders() {
		if h.GetHeader().GetKey() == name {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

func TestStreamErrorStatuses(t *testing.T) {
	big := strings.Repeat("x", 200)
	tests := []struct {
		name   string
		err    error
		cfg    Config
		steps  []*pb.ProcessingRequest
		status int
		code   string
	}{
		{name: "no worker is 503", err: ErrNoWorker("no worker serves model m"), steps: []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true)}, status: 503, code: "no_worker"},
		{name: "shed is 429", err: ErrShed("queue full"), steps: []*pb.ProcessingRequest{chatHeaders(ModeFullDuplex), reqBody(chatBody, true)}, status: 429, code: "queue_full"},
		{name: "bad body is 400", err: ErrBadBody("body is not JSON", nil), steps: []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody("{", true)}, status: 400, code: "invalid_body"},
		{name: "other decider errors are 500", err: context.DeadlineExceeded, steps: []*pb.ProcessingRequest{chatHeaders(ModeNone)}, status: 0},
		{name: "content-length over the limit is 413 at the headers", cfg: Config{MaxBodyBytes: 100}, steps: []*pb.ProcessingRequest{chatHeaders(ModeFullDuplex, hdr{"content-length", "101"})}, status: 413, code: "request_too_large"},
		{name: "duplex body over the limit is 413", cfg: Config{MaxBodyBytes: 100}, steps: []*pb.ProcessingRequest{chatHeaders(ModeFullDuplex), reqBody(big[:60], false), reqBody(big[:60], false)}, status: 413, code: "request_too_large"},
		{name: "buffered body over the limit is 413", cfg: Config{MaxBodyBytes: 100}, steps: []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(big, true)}, status: 413, code: "request_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet()
			f.err = tt.err
			s := NewStream(&tt.cfg, f)
			var out []*pb.ProcessingResponse
			var err error
			for _, m := range tt.steps {
				if out, err = s.Step(context.Background(), m); err != nil {
					break
				}
			}
			if tt.status == 0 { // context errors from the decider end the stream
				if status.Code(err) != codes.DeadlineExceeded {
					t.Fatalf("err = %v, want DeadlineExceeded", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			st, e := immediateOf(t, out)
			if st != tt.status || e.Error.Code != tt.code {
				t.Errorf("got %d %q, want %d %q", st, e.Error.Code, tt.status, tt.code)
			}
			if s.Status() != tt.status {
				t.Errorf("Status() = %d", s.Status())
			}
			// Chunks Envoy had in flight need no answer.
			if more, err := s.Step(context.Background(), reqBody("late", true)); err != nil || len(more) != 0 {
				t.Errorf("late chunk after immediate response: %v %v", kinds(more), err)
			}
		})
	}
	t.Run("generic error is 500", func(t *testing.T) {
		f := newFleet()
		f.err = bytes.ErrTooLarge
		out, err := NewStream(&Config{}, f).Step(context.Background(), chatHeaders(ModeNone))
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := immediateOf(t, out); st != 500 {
			t.Errorf("status %d", st)
		}
	})
}
