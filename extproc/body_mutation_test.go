package extproc

import (
	"context"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// rewriter is a fleetDecider that also replaces the request body.
type rewriter struct{ *fleetDecider }

func (r rewriter) Decide(ctx context.Context, req *Request) (Decision, error) {
	d, err := r.fleetDecider.Decide(ctx, req)
	if err == nil {
		d.Body = append([]byte("rewritten:"), req.Body...)
	}
	return d, err
}

func TestDecisionBodyReplacesRequestBody(t *testing.T) {
	ctx := context.Background()
	t.Run("buffered", func(t *testing.T) {
		s := NewStream(&Config{}, rewriter{newFleet()})
		if _, err := s.Step(ctx, chatHeaders(ModeBuffered)); err != nil {
			t.Fatal(err)
		}
		out, err := s.Step(ctx, reqBody(`{"model":"m"}`, true))
		if err != nil || len(out) != 1 {
			t.Fatalf("out %v err %v", kinds(out), err)
		}
		cr := out[0].GetRequestBody().GetResponse()
		if got := string(cr.GetBodyMutation().GetBody()); got != `rewritten:{"model":"m"}` {
			t.Fatalf("body mutation %q", got)
		}
		if !hasRemoved(cr, "content-length") {
			t.Fatal("content-length must be dropped with a new body")
		}
	})
	t.Run("buffered partial keeps the body", func(t *testing.T) {
		s := NewStream(&Config{}, rewriter{newFleet()})
		if _, err := s.Step(ctx, chatHeaders(ModeBufferedPart)); err != nil {
			t.Fatal(err)
		}
		out, err := s.Step(ctx, reqBody(`{"model":`, false))
		if err != nil || len(out) != 1 {
			t.Fatalf("out %v err %v", kinds(out), err)
		}
		if out[0].GetRequestBody().GetResponse().GetBodyMutation() != nil {
			t.Fatal("a truncated body must not be replaced")
		}
	})
	t.Run("full duplex", func(t *testing.T) {
		s := NewStream(&Config{}, rewriter{newFleet()})
		if _, err := s.Step(ctx, chatHeaders(ModeFullDuplex)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Step(ctx, reqBody(`{"model"`, false)); err != nil {
			t.Fatal(err)
		}
		out, err := s.Step(ctx, reqBody(`:"m"}`, true))
		if err != nil {
			t.Fatal(err)
		}
		if !hasRemoved(out[0].GetRequestHeaders().GetResponse(), "content-length") {
			t.Fatal("content-length must be dropped with a new body")
		}
		var body []byte
		for _, r := range out[1:] {
			sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			body = append(body, sr.GetBody()...)
		}
		if string(body) != `rewritten:{"model":"m"}` {
			t.Fatalf("streamed body %q", body)
		}
	})
}

func hasRemoved(cr *pb.CommonResponse, name string) bool {
	for _, h := range cr.GetHeaderMutation().GetRemoveHeaders() {
		if h == name {
			return true
		}
	}
	return false
}
