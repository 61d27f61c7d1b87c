package extproc

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

type step struct {
	in   *pb.ProcessingRequest
	want []string // response kinds, in order
	code codes.Code
}

func TestStreamLifecycles(t *testing.T) {
	sse := "data: {\"x\":1}\n\ndata: {\"x\":2}\n\n"
	tests := []struct {
		name      string
		steps     []step
		close     error
		prefill   int
		started   int // response headers with no body to follow
		progress  int
		frees     []Outcome
		hasBody   bool
		bodyAfter string
	}{
		{
			name: "buffered request routes in the body response and frees at response end",
			steps: []step{
				{in: chatHeaders(ModeBuffered), want: []string{"req_headers"}},
				{in: reqBody(chatBody, true), want: []string{"req_body+route"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
				{in: respBody(sse, false), want: []string{"resp_body"}},
				{in: respBody("data: [DONE]\n\n", true), want: []string{"resp_body"}},
			},
			prefill: 1, started: 1, progress: 2, frees: []Outcome{OutcomeOK}, hasBody: true, bodyAfter: chatBody,
		},
		{
			name: "full duplex holds the headers response until the body ends",
			steps: []step{
				{in: chatHeaders(ModeFullDuplex), want: []string{}},
				{in: reqBody(chatBody[:10], false), want: []string{}},
				{in: reqBody(chatBody[10:], true), want: []string{"req_headers+route", "req_chunk_eos"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
				{in: respBody(sse, true), want: []string{"resp_body"}},
			},
			prefill: 1, started: 1, progress: 2, frees: []Outcome{OutcomeOK}, hasBody: true, bodyAfter: chatBody,
		},
		{
			name: "full duplex with request trailers answers headers, body, then trailers",
			steps: []step{
				{in: chatHeaders(ModeFullDuplex), want: []string{}},
				{in: reqBody(chatBody, false), want: []string{}},
				{in: reqTrailers(), want: []string{"req_headers+route", "req_chunk", "req_trailers"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
				{in: respTrailers(), want: []string{"resp_trailers"}},
			},
			started: 1, frees: []Outcome{OutcomeOK}, hasBody: true, bodyAfter: chatBody,
		},
		{
			name: "full duplex request with an empty body still returns one end-of-stream chunk",
			steps: []step{
				{in: chatHeaders(ModeFullDuplex), want: []string{}},
				{in: reqBody("", true), want: []string{"req_headers+route", "req_chunk_eos"}},
			},
			close: context.Canceled, frees: []Outcome{OutcomeReset}, hasBody: true,
		},
		{
			name: "full duplex response chunks are echoed as streamed responses",
			steps: []step{
				{in: headerMsg(ModeFullDuplex, ModeFullDuplex, false, hdr{":path", "/v1/completions"}), want: []string{}},
				{in: reqBody(`{"model":"m","prompt":"x"}`, true), want: []string{"req_headers+route", "req_chunk_eos"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
				{in: respBody(sse, false), want: []string{"resp_chunk"}},
				{in: respBody("", true), want: []string{"resp_chunk_eos"}},
			},
			prefill: 1, progress: 2, frees: []Outcome{OutcomeOK}, hasBody: true,
		},
		{
			name: "body mode NONE routes on headers alone",
			steps: []step{
				{in: chatHeaders(ModeNone), want: []string{"req_headers+route"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
			},
			started: 1, frees: []Outcome{OutcomeOK}, hasBody: false,
		},
		{
			name: "buffered request without a body routes on its headers",
			steps: []step{
				{in: headerMsg(ModeBuffered, ModeNone, true, hdr{":method", "GET"}, hdr{":path", "/v1/models"}), want: []string{"req_headers+route"}},
				{in: respHeaders("200", true), want: []string{"resp_headers"}},
			},
			prefill: 1, frees: []Outcome{OutcomeOK}, hasBody: false,
		},
		{
			name: "streamed request mode routes on headers and passes chunks through",
			steps: []step{
				{in: chatHeaders(ModeStreamed), want: []string{"req_headers+route"}},
				{in: reqBody("{", false), want: []string{"req_body"}},
				{in: reqBody("}", true), want: []string{"req_body"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
			},
			// Response body NONE: Envoy cancelling the stream after the
			// response headers is how the response's end shows.
			close: context.Canceled, started: 1, frees: []Outcome{OutcomeOK}, hasBody: false,
		},
		{
			name: "an upstream error status frees the load at the response headers",
			steps: []step{
				{in: chatHeaders(ModeBuffered), want: []string{"req_headers"}},
				{in: reqBody(chatBody, true), want: []string{"req_body+route"}},
				{in: respHeaders("503", false), want: []string{"resp_headers"}},
				{in: respBody("oops", true), want: []string{"resp_body"}},
			},
			frees: []Outcome{OutcomeUpstreamError}, hasBody: true, bodyAfter: chatBody,
		},
		{
			name: "a client error status frees the load as an error status, not an upstream failure",
			steps: []step{
				{in: chatHeaders(ModeBuffered), want: []string{"req_headers"}},
				{in: reqBody(chatBody, true), want: []string{"req_body+route"}},
				{in: respHeaders("404", false), want: []string{"resp_headers"}},
				{in: respBody("nope", true), want: []string{"resp_body"}},
			},
			frees: []Outcome{OutcomeErrorStatus}, hasBody: true, bodyAfter: chatBody,
		},
		{
			name: "a stream cancelled after routing frees the load",
			steps: []step{
				{in: headerMsg(ModeBuffered, ModeStreamed, false, hdr{":method", "POST"}, hdr{":path", "/v1/chat/completions"}), want: []string{"req_headers"}},
				{in: reqBody(chatBody, true), want: []string{"req_body+route"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
				{in: respBody("data: {}\n\n", false), want: []string{"resp_body"}},
			},
			close: context.Canceled, prefill: 1, progress: 1, frees: []Outcome{OutcomeReset}, hasBody: true, bodyAfter: chatBody,
		},
		{
			name: "response mode NONE frees as ok when Envoy closes the stream cleanly",
			steps: []step{
				{in: chatHeaders(ModeFullDuplex), want: []string{}},
				{in: reqBody(chatBody, true), want: []string{"req_headers+route", "req_chunk_eos"}},
				{in: respHeaders("200", false), want: []string{"resp_headers"}},
			},
			started: 1, frees: []Outcome{OutcomeOK}, hasBody: true, bodyAfter: chatBody,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet()
			s := NewStream(&Config{}, f)
			for i, st := range tt.steps {
				out, err := s.Step(context.Background(), st.in)
				checkEnvoyRules(t, st.in, out, err)
				if status.Code(err) != st.code {
					t.Fatalf("step %d: err = %v, want code %v", i, err, st.code)
				}
				if got := kinds(out); !slices.Equal(got, st.want) {
					t.Fatalf("step %d: responses %v, want %v", i, got, st.want)
				}
			}
			s.Close(tt.close)
			s.Close(tt.close) // idempotent
			if len(f.seen) != 1 {
				t.Fatalf("Decide called %d times, want 1", len(f.seen))
			}
			if f.seen[0].HasBody != tt.hasBody {
				t.Errorf("HasBody = %v, want %v", f.seen[0].HasBody, tt.hasBody)
			}
			if tt.bodyAfter != "" && string(f.seen[0].Body) != tt.bodyAfter {
				t.Errorf("Decider saw body %q, want %q", f.seen[0].Body, tt.bodyAfter)
			}
			prefill, progress, _, frees := f.lastTicket().snapshot()
			if prefill != tt.prefill || progress != tt.progress || !slices.Equal(frees, tt.frees) {
				t.Errorf("ticket: prefill=%d progress=%d frees=%v, want %d %d %v", prefill, progress, frees, tt.prefill, tt.progress, tt.frees)
			}
			if started := f.lastTicket().responseStarts(); started != tt.started {
				t.Errorf("ticket: %d ResponseStarted, want %d", started, tt.started)
			}
		})
	}
}

func TestStreamRejectsOutOfOrderMessages(t *testing.T) {
	tests := []struct {
		name  string
		steps []*pb.ProcessingRequest
		code  codes.Code
		freed bool
	}{
		{name: "body before headers", steps: []*pb.ProcessingRequest{reqBody("{}", true)}, code: codes.FailedPrecondition},
		{name: "headers twice", steps: []*pb.ProcessingRequest{chatHeaders(ModeBuffered), chatHeaders(ModeBuffered)}, code: codes.FailedPrecondition},
		{name: "response headers before the duplex body ended", steps: []*pb.ProcessingRequest{chatHeaders(ModeFullDuplex), reqBody("{", false), respHeaders("200", false)}, code: codes.FailedPrecondition},
		{name: "response body before response headers", steps: []*pb.ProcessingRequest{chatHeaders(ModeNone), respBody("x", true)}, code: codes.FailedPrecondition, freed: true},
		{name: "request body after routing", steps: []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), reqBody("more", true)}, code: codes.FailedPrecondition, freed: true},
		{name: "response trailers before response headers", steps: []*pb.ProcessingRequest{chatHeaders(ModeNone), respTrailers()}, code: codes.FailedPrecondition, freed: true},
		{name: "message with no request", steps: []*pb.ProcessingRequest{chatHeaders(ModeNone), {}}, code: codes.InvalidArgument, freed: true},
		{name: "GRPC body mode", steps: []*pb.ProcessingRequest{headerMsg(ModeGRPC, ModeNone, false)}, code: codes.Unimplemented},
		{name: "response after the response ended", steps: []*pb.ProcessingRequest{chatHeaders(ModeNone), respHeaders("200", true), respBody("x", true)}, code: codes.FailedPrecondition, freed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet()
			s := NewStream(&Config{}, f)
			var err error
			for _, m := range tt.steps {
				if _, err = s.Step(context.Background(), m); err != nil {
					break
				}
			}
			if status.Code(err) != tt.code {
				t.Fatalf("err = %v, want code %v", err, tt.code)
			}
			if !strings.Contains(err.Error(), "ext_proc:") {
				t.Errorf("error %q does not say where it comes from", err)
			}
			s.Close(err)
			if tk := f.lastTicket(); tt.freed != (tk != nil) {
				t.Fatalf("ticket present = %v, want %v", tk != nil, tt.freed)
			} else if tk != nil {
				_, _, _, frees := tk.snapshot()
				if len(frees) != 1 {
					t.Errorf("frees = %v, want exactly one", frees)
				}
			}
		})
	}
}

func TestStreamOverwritesSpoofedHeaders(t *testing.T) {
	f := newFleet()
	s := NewStream(&Config{}, f)
	spoof := []hdr{{"x-target-worker", "evil"}, {DestinationHeader, "6.6.6.6:1"}, {CachedTokensHeader, "999"}, {PredictedCachedTokensHeader, "999"}}
	if _, err := s.Step(context.Background(), chatHeaders(ModeBuffered, spoof...)); err != nil {
		t.Fatal(err)
	}
	out, err := s.Step(context.Background(), reqBody(chatBody, true))
	if err != nil {
		t.Fatal(err)
	}
	rt, ok := routeOf(out[0])
	if !ok {
		t.Fatalf("no route in %v", kinds(out))
	}
	if rt.set["x-target-worker"] != "w0" || !rt.overwr["x-target-worker"] {
		t.Errorf("target header %q overwrite=%v, want w0 replacing the client's copy", rt.set["x-target-worker"], rt.overwr["x-target-worker"])
	}
	want := "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"
	if rt.set[DestinationHeader] != want || !rt.overwr[DestinationHeader] {
		t.Errorf("destination %q, want %q replacing the client's copy", rt.set[DestinationHeader], want)
	}
	if rt.metadata != want {
		t.Errorf("envoy.lb metadata %q, want the header's value %q", rt.metadata, want)
	}
	if !rt.clear {
		t.Error("clear_route_cache not set")
	}
	if !slices.Contains(rt.removed, CachedTokensHeader) || !slices.Contains(rt.removed, ModeHeader) {
		t.Errorf("debug headers not removed: %v", rt.removed)
	}
	if _, spoofed := rt.set[CachedTokensHeader]; spoofed {
		t.Error("debug header set while debug headers are off")
	}
	// The fleet made no prediction: the client's copy must not reach the worker.
	if _, set := rt.set[PredictedCachedTokensHeader]; set || !slices.Contains(rt.removed, PredictedCachedTokensHeader) {
		t.Errorf("prediction header set %v, removed %v; want removed only", set, rt.removed)
	}
	if len(rt.set) != 2 {
		t.Errorf("headers set %v, want only the target and destination", rt.set)
	}
}

func TestStreamTellsTheWorkerItsPrediction(t *testing.T) {
	f := newFleet()
	f.workers[0].Predicted = true
	s := NewStream(&Config{}, f)
	if _, err := s.Step(context.Background(), chatHeaders(ModeBuffered, hdr{PredictedCachedTokensHeader, "999"})); err != nil {
		t.Fatal(err)
	}
	out, err := s.Step(context.Background(), reqBody(chatBody, true))
	if err != nil {
		t.Fatal(err)
	}
	rt, ok := routeOf(out[0])
	if !ok {
		t.Fatalf("no route in %v", kinds(out))
	}
	if rt.set[PredictedCachedTokensHeader] != "32" || !rt.overwr[PredictedCachedTokensHeader] {
		t.Errorf("prediction header %q (overwrite %v), want 32 replacing the client's copy", rt.set[PredictedCachedTokensHeader], rt.overwr[PredictedCachedTokensHeader])
	}
	if slices.Contains(rt.removed, PredictedCachedTokensHeader) {
		t.Errorf("prediction header both set and removed: %v", rt.removed)
	}
}

func TestStreamDebugHeadersAndAddressTarget(t *testing.T) {
	f := newFleet()
	s := NewStream(&Config{DebugHeaders: true, TargetValue: TargetAddress, TargetHeader: "x-worker"}, f)
	out, err := s.Step(context.Background(), chatHeaders(ModeNone))
	if err != nil {
		t.Fatal(err)
	}
	rt, _ := routeOf(out[0])
	if rt.set["x-worker"] != "10.0.0.1:8000" || rt.set[CachedTokensHeader] != "32" || rt.set[ModeHeader] != "kv" {
		t.Errorf("headers %v", rt.set)
	}
}

func TestStreamReadsRawValueWithValueFallback(t *testing.T) {
	f := newFleet()
	s := NewStream(&Config{}, f)
	m := chatHeaders(ModeNone)
	m.GetRequestHeaders().Headers.Headers = append(m.GetRequestHeaders().Headers.Headers,
		&corev3.HeaderValue{Key: "X-Old", Value: "from-value"},
		&corev3.HeaderValue{Key: "x-both", Value: "ignored", RawValue: []byte("raw")})
	if _, err := s.Step(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	got := f.seen[0]
	if got.Header("x-old") != "from-value" || got.Header("x-both") != "raw" || got.Path != "/v1/chat/completions" || got.Method != "POST" {
		t.Errorf("request = %+v", got)
	}
}

func TestStreamSubsetHint(t *testing.T) {
	t.Run("restricts the choice", func(t *testing.T) {
		f := newFleet()
		s := NewStream(&Config{}, f)
		out, err := s.Step(context.Background(), withSubset(chatHeaders(ModeNone), "10.0.0.3:8000", "10.0.0.2:8000"))
		if err != nil {
			t.Fatal(err)
		}
		rt, _ := routeOf(out[0])
		if rt.set["x-target-worker"] != "w1" || rt.set[DestinationHeader] != "10.0.0.2:8000,10.0.0.3:8000" {
			t.Errorf("route %v", rt.set)
		}
	})
	t.Run("empty list is a 503", func(t *testing.T) {
		f := newFleet()
		s := NewStream(&Config{}, f)
		out, err := s.Step(context.Background(), withSubset(chatHeaders(ModeNone)))
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := immediateOf(t, out); st != 503 {
			t.Errorf("status %d, want 503", st)
		}
		if !f.seen[0].HasSubset || len(f.seen[0].Subset) != 0 {
			t.Errorf("decider saw subset %v (has=%v)", f.seen[0].Subset, f.seen[0].HasSubset)
		}
	})
}

func TestStreamServedEndpointReport(t *testing.T) {
	f := newFleet()
	s := NewStream(&Config{}, f)
	for _, m := range []*pb.ProcessingRequest{chatHeaders(ModeNone), withServed(respHeaders("200", false), "10.0.0.2:8000")} {
		if _, err := s.Step(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	_, _, served, _ := f.lastTicket().snapshot()
	if !slices.Equal(served, []string{"10.0.0.2:8000"}) {
		t.Errorf("served = %v", served)
	}
}

func TestStreamChunksLargeBodies(t *testing.T) {
	body := bytes.Repeat([]byte("abcdefghij"), 15_000) // 150,000 bytes
	f := newFleet()
	s := NewStream(&Config{}, f)
	if _, err := s.Step(context.Background(), chatHeaders(ModeFullDuplex)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(body); i += 40_000 {
		end := min(i+40_000, len(body))
		out, err := s.Step(context.Background(), reqBody(string(body[i:end]), end == len(body)))
		if err != nil {
			t.Fatal(err)
		}
		if end < len(body) {
			if len(out) != 0 {
				t.Fatalf("answered before the end of the body: %v", kinds(out))
			}
			continue
		}
		want := []string{"req_headers+route", "req_chunk", "req_chunk", "req_chunk_eos"}
		if !slices.Equal(kinds(out), want) {
			t.Fatalf("responses %v, want %v", kinds(out), want)
		}
		var echoed []byte
		for _, r := range out[1:] {
			c := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()
			if len(c) > 62_000 {
				t.Errorf("chunk of %d bytes exceeds 62,000", len(c))
			}
			echoed = append(echoed, c...)
		}
		if !bytes.Equal(echoed, body) {
			t.Error("echoed body differs from the request body")
		}
	}
}

func TestStreamCancelledWhileDeciding(t *testing.T) {
	f := newFleet()
	f.block = true
	ctx, cancel := context.WithCancel(context.Background())
	s := NewStream(&Config{}, f)
	cancel()
	_, err := s.Step(ctx, chatHeaders(ModeNone))
	if status.Code(err) != codes.Canceled {
		t.Fatalf("err = %v, want Canceled", err)
	}
}

func TestStreamObservabilityModeSendsNothing(t *testing.T) {
	f := newFleet()
	s := NewStream(&Config{}, f)
	m := chatHeaders(ModeNone)
	m.ObservabilityMode = true
	out, err := s.Step(context.Background(), m)
	if err != nil || out != nil {
		t.Fatalf("out=%v err=%v", kinds(out), err)
	}
	if len(f.seen) != 1 {
		t.Error("request not seen")
	}
}

func TestSSECounterAcrossChunks(t *testing.T) {
	tests := []struct {
		chunks []string
		want   int
	}{
		{[]string{"data: a\n\ndata: b\n\n"}, 2},
		{[]string{"da", "ta: a\n\nd", "ata: b\n\n"}, 2},
		{[]string{"data: a\n\n", "data: [DONE]\n\n"}, 1},
		{[]string{"{\"data\": 1}"}, 0},
		{[]string{": comment\n", "event: x\ndata: y\n\n"}, 1},
	}
	for _, tt := range tests {
		var c sseCounter
		n := 0
		for _, ch := range tt.chunks {
			n += c.count([]byte(ch))
		}
		if n != tt.want {
			t.Errorf("%q: %d events, want %d", tt.chunks, n, tt.want)
		}
	}
}
