package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// commonOf is the CommonResponse of any headers or body answer, or nil.
func commonOf(r *pb.ProcessingResponse) *pb.CommonResponse {
	switch x := r.Response.(type) {
	case *pb.ProcessingResponse_RequestHeaders:
		return x.RequestHeaders.GetResponse()
	case *pb.ProcessingResponse_RequestBody:
		return x.RequestBody.GetResponse()
	case *pb.ProcessingResponse_ResponseHeaders:
		return x.ResponseHeaders.GetResponse()
	case *pb.ProcessingResponse_ResponseBody:
		return x.ResponseBody.GetResponse()
	}
	return nil
}

// checkEnvoyRules holds one Step's answers to the Envoy rules that every
// answer must keep, whatever the mode or message order:
//   - clear_route_cache only in a CommonResponse that carries a header
//     mutation (Envoy ignores it otherwise, and FULL_DUPLEX_STREAMED
//     rejects it in a body answer without one);
//   - header values only in raw_value (Envoy ≥ 1.31 ignores value when
//     raw_value is set and some builds reject both);
//   - a response-body message is always answered with a response-body
//     response (Envoy waits for one per chunk in STREAMED mode and the
//     upstream stalls otherwise).
func checkEnvoyRules(t testing.TB, in *pb.ProcessingRequest, out []*pb.ProcessingResponse, err error) {
	t.Helper()
	for _, r := range out {
		common := commonOf(r)
		var hm *pb.HeaderMutation
		if ir, ok := r.Response.(*pb.ProcessingResponse_ImmediateResponse); ok {
			hm = ir.ImmediateResponse.GetHeaders()
		}
		if common != nil {
			hm = common.GetHeaderMutation()
			if common.GetClearRouteCache() && len(hm.GetSetHeaders()) == 0 {
				t.Fatalf("clear_route_cache without a header mutation in %v", r)
			}
		}
		for _, h := range hm.GetSetHeaders() {
			checkRawOnly(t, h)
		}
	}
	if _, isRespBody := in.GetRequest().(*pb.ProcessingRequest_ResponseBody); isRespBody && err == nil {
		answered := false
		for _, r := range out {
			if _, ok := r.Response.(*pb.ProcessingResponse_ResponseBody); ok {
				answered = true
			}
		}
		if !answered {
			t.Fatalf("response body chunk left unanswered: %v", out)
		}
	}
}

func checkRawOnly(t testing.TB, h *corev3.HeaderValueOption) {
	t.Helper()
	if h.GetHeader().GetValue() != "" {
		t.Fatalf("header %s written with value instead of raw_value", h.GetHeader().GetKey())
	}
}

func TestEveryStreamedResponseChunkIsAnswered(t *testing.T) {
	for _, status := range []string{"200", "503"} {
		t.Run("status "+status, func(t *testing.T) {
			f := newFleet()
			s := NewStream(&Config{}, f)
			steps := []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders(status, false)}
			for range 50 {
				steps = append(steps, respBody("data: {}\n\n", false))
			}
			steps = append(steps, respBody("", true))
			answered := 0
			for i, m := range steps {
				out, err := s.Step(t.Context(), m)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				checkEnvoyRules(t, m, out, err)
				if i >= 3 {
					answered += len(out)
				}
			}
			if answered != 51 {
				t.Fatalf("%d answers to 51 response body chunks", answered)
			}
			s.Close(nil)
		})
	}
}
