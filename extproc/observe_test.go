package extproc

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	extprocmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// bodyFirst is the request body as the one-exchange bootstraps send it:
// the first message of the stream, with the request attributes in place of
// the skipped request headers.
func bodyFirst(body string, attrs map[string]any) *pb.ProcessingRequest {
	m := reqBody(body, true)
	m.ProtocolConfig = &pb.ProtocolConfiguration{RequestBodyMode: extprocmode.ProcessingMode_BUFFERED, ResponseBodyMode: extprocmode.ProcessingMode_NONE}
	st, err := structpb.NewStruct(attrs)
	if err != nil {
		panic(err)
	}
	m.Attributes = map[string]*structpb.Struct{AttributesNamespace: st}
	return m
}

// observedHeaders is the observing filter's message: response headers in
// observability mode, with the request id and the code details.
func observedHeaders(id, code, details string) *pb.ProcessingRequest {
	m := respHeaders(code, false)
	m.ObservabilityMode = true
	m.Attributes = map[string]*structpb.Struct{AttributesNamespace: {Fields: map[string]*structpb.Value{
		RequestIDAttribute: structpb.NewStringValue(id), CodeDetailsAttribute: structpb.NewStringValue(details),
	}}}
	return m
}

var chatAttrs = map[string]any{
	RequestPathAttribute: "/v1/chat/completions", RequestMethodAttribute: "POST", RequestIDAttribute: "req-1",
	"request.headers['x-kvroute-priority']": "3",
}

// With the request headers skipped, the first message is the body: the
// request line, id and priority come from the request attributes, and the
// one answer carries the route in envoy.lb metadata (the target header's
// name holds the cluster, which the bootstrap's routes match).
func TestBodyFirstStreamRoutesFromAttributes(t *testing.T) {
	f := newFleet()
	s := NewStream(&Config{ResponseWorkerHeader: true}, f)
	out, err := s.Step(context.Background(), bodyFirst(chatBody, chatAttrs))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].GetRequestBody() == nil {
		t.Fatalf("answers %v, want one request body answer", kinds(out))
	}
	seen := f.seen[0]
	if seen.Path != "/v1/chat/completions" || seen.Method != "POST" || seen.Header(RequestIDHeader) != "req-1" ||
		seen.Header("x-kvroute-priority") != "3" || !seen.HasBody {
		t.Errorf("decider saw path %q method %q id %q priority %q body %v", seen.Path, seen.Method,
			seen.Header(RequestIDHeader), seen.Header("x-kvroute-priority"), seen.HasBody)
	}
	lb := out[0].GetDynamicMetadata().GetFields()[LBMetadataNamespace].GetStructValue().GetFields()
	if got := lb[DefaultTargetHeader].GetStringValue(); got != "w0" {
		t.Errorf("envoy.lb %s = %q, want the cluster w0", DefaultTargetHeader, got)
	}
	if got := lb[WorkerHeader].GetStringValue(); got != "w0" {
		t.Errorf("envoy.lb %s = %q, want w0 (ResponseWorkerHeader)", WorkerHeader, got)
	}
	if got := lb[DestinationHeader].GetStringValue(); got != "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000" {
		t.Errorf("envoy.lb %s = %q", DestinationHeader, got)
	}
}

// A body that comes first can be routed only when Envoy buffered it: in
// any other mode the answer to the body is not the one Envoy waits for.
func TestBodyFirstStreamNeedsBufferedMode(t *testing.T) {
	for _, pc := range []*pb.ProtocolConfiguration{nil, {RequestBodyMode: extprocmode.ProcessingMode_STREAMED}, {RequestBodyMode: extprocmode.ProcessingMode_FULL_DUPLEX_STREAMED}} {
		m := bodyFirst(chatBody, chatAttrs)
		m.ProtocolConfig = pc
		if _, err := NewStream(&Config{}, newFleet()).Step(context.Background(), m); err == nil {
			t.Errorf("protocol config %v: body before headers accepted", pc)
		}
	}
}

// The request attributes become headers by name; anything else is left
// out.
func TestAttributeHeaders(t *testing.T) {
	st, _ := structpb.NewStruct(map[string]any{
		RequestPathAttribute: "/p", RequestIDAttribute: "id", "request.headers['x-a']": "1",
		"request.headers['X-Upper']": "no", "request.headers['']": "no", "request.headers['a b']": "no",
		"request.headers['x-n']": 5.0, "response.code_details": "no", "request.headers['x-b'": "no",
	})
	got := attributeHeaders(st)
	want := map[string]string{":path": "/p", RequestIDHeader: "id", "x-a": "1"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// routed starts an observed stream and routes one request on it.
func routed(t *testing.T, f *fleetDecider, id string) *Stream {
	t.Helper()
	s := NewStream(&Config{}, f)
	s.SetResponseObserved()
	attrs := cloneAttrs(chatAttrs)
	attrs[RequestIDAttribute] = id
	if _, err := s.Step(context.Background(), bodyFirst(chatBody, attrs)); err != nil {
		t.Fatal(err)
	}
	if !s.AwaitsEnd() {
		t.Fatal("a routed observed stream does not await its end")
	}
	return s
}

func cloneAttrs(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// The routing stream's end frees the load; the observing filter's report
// decides the outcome, whether it comes before the end or, within the
// grace, after it. Without a report the end is a normal end; a report for
// an unknown request or after the grace changes nothing.
func TestObservedStreamOutcomes(t *testing.T) {
	const grace = 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		// report is sent before (-1) or after (+1) the end, or not at all (0).
		when    int
		code    string
		details string
		endErr  error
		want    Outcome
	}{
		{"no report", 0, "", "", io.EOF, OutcomeOK},
		{"200 before the end", -1, "200", "via_upstream", io.EOF, OutcomeOK},
		{"503 from the worker before the end", -1, "503", "via_upstream", io.EOF, OutcomeUpstreamError},
		{"503 from the worker after the end", +1, "503", "via_upstream", io.EOF, OutcomeUpstreamError},
		{"Envoy's own 503 after the end", +1, "503", "no_healthy_upstream", io.EOF, OutcomeLocalReply},
		{"404 after the end", +1, "404", "via_upstream", io.EOF, OutcomeErrorStatus},
		{"stream failed", 0, "", "", io.ErrUnexpectedEOF, OutcomeReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet()
			o := newObservers(grace)
			s := routed(t, f, "req-"+tc.name)
			e := o.register("req-"+tc.name, s)
			if e == nil {
				t.Fatal("not registered")
			}
			report := func() {
				if !o.observe(observedHeaders("req-"+tc.name, tc.code, tc.details)) {
					t.Error("report not taken")
				}
			}
			if tc.when < 0 {
				report()
			}
			o.end(e, tc.endErr)
			if tc.when > 0 {
				report()
			}
			waitFrees(t, f.lastTicket(), []Outcome{tc.want})
			if n := o.pending(); n != 0 {
				t.Errorf("%d streams still registered", n)
			}
			if o.observe(observedHeaders("req-"+tc.name, "503", "via_upstream")) {
				t.Error("a report after the request ended was taken")
			}
		})
	}
}

// The end waits for the report no longer than the grace; a report for a
// request this process did not route is not taken; a request id that is
// already registered is not registered twice.
func TestObservedStreamGraceAndIDs(t *testing.T) {
	f := newFleet()
	o := newObservers(50 * time.Millisecond)
	s := routed(t, f, "a")
	e := o.register("a", s)
	if o.register("a", routed(t, f, "a")) != nil || o.register("", s) != nil {
		t.Error("a taken or empty request id registered")
	}
	start := time.Now()
	o.end(e, io.EOF)
	if _, _, _, frees := f.tickets[0].snapshot(); len(frees) != 0 {
		t.Fatalf("freed %v before the grace", frees)
	}
	waitFrees(t, f.tickets[0], []Outcome{OutcomeOK})
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("freed after %v, before the grace", d)
	}
	if o.observe(observedHeaders("b", "200", "via_upstream")) {
		t.Error("a report for an unknown request was taken")
	}
}

// Over gRPC: a stream that carries the observed marker in its metadata
// answers the body once, stays open through the response, takes the
// observing stream's report, and its end frees the load with the report's
// outcome; the observing stream is closed by the server after its report.
func TestServerMatchesObservingStreamToRoutingStream(t *testing.T) {
	f := newFleet()
	m := &exchangeCounter{byPhase: map[string]int{}}
	srv, cc := startServer(t, ServerConfig{Decider: f, Metrics: m, StreamIdleTimeout: 100 * time.Millisecond})
	srv.SetReady(true)
	ctx := metadata.AppendToOutgoingContext(context.Background(), ObservedMetadataKey, ObservedMetadataValue)
	attrs := cloneAttrs(chatAttrs)
	attrs[RequestIDAttribute] = "grpc-1"
	routing, out := exchangeOpen(t, ctx, cc, []*pb.ProcessingRequest{bodyFirst(chatBody, attrs)}, 1)
	if out[0].GetRequestBody() == nil {
		t.Fatalf("answer %v, want the request body's", kinds(out))
	}
	time.Sleep(300 * time.Millisecond) // past the idle timeout: a routed observed stream awaits its end
	obs, err := pb.NewExternalProcessorClient(cc).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Send(observedHeaders("grpc-1", "503", "via_upstream")); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("observing stream: %v, want the server to close it", err)
	}
	waitFrees(t, f.lastTicket(), []Outcome{OutcomeUpstreamError})
	routing.CloseSend()
	if _, err := routing.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("routing stream: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		got := slices.Clone(m.streams)
		m.mu.Unlock()
		if slices.Equal(got, []int{1}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("blocking exchanges per stream %v, want [1] (the observing stream reports none)", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With two replicas behind one Envoy cluster, the observing stream may
// reach the replica that did not route the request: that replica forwards
// the report, and the routing replica applies it (ObservePeer) within the
// grace after its routing stream's end.
func TestObservationForwardedToThePeerThatRouted(t *testing.T) {
	fa, fb := newFleet(), newFleet()
	forwarded := make(chan []byte, 1)
	a, ccA := startServer(t, ServerConfig{Decider: fa, ObserveGrace: 10 * time.Second})
	b, ccB := startServer(t, ServerConfig{Decider: fb, ForwardObservation: func(r []byte) { forwarded <- r }})
	a.SetReady(true)
	b.SetReady(true)
	ctx := metadata.AppendToOutgoingContext(context.Background(), ObservedMetadataKey, ObservedMetadataValue)
	attrs := cloneAttrs(chatAttrs)
	attrs[RequestIDAttribute] = "peer-1"
	routing, _ := exchangeOpen(t, ctx, ccA, []*pb.ProcessingRequest{bodyFirst(chatBody, attrs)}, 1)
	routing.CloseSend() // the response ended before the report came
	if _, err := routing.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("routing stream: %v", err)
	}
	obs, err := pb.NewExternalProcessorClient(ccB).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Send(observedHeaders("peer-1", "503", "via_upstream")); err != nil {
		t.Fatal(err)
	}
	var report []byte
	select {
	case report = <-forwarded:
	case <-time.After(5 * time.Second):
		t.Fatal("the replica that did not route forwarded nothing")
	}
	if b.ObservePeer(report) {
		t.Error("the replica that did not route took its own forwarded report")
	}
	if !a.ObservePeer(report) {
		t.Fatal("the routing replica did not take the forwarded report")
	}
	waitFrees(t, fa.lastTicket(), []Outcome{OutcomeUpstreamError})
	if a.ObservePeer(report) {
		t.Error("a report taken twice")
	}
	for _, bad := range [][]byte{nil, []byte("not protobuf"), make([]byte, maxObservationBytes+1)} {
		if a.ObservePeer(bad) {
			t.Errorf("report %q taken", bad[:min(len(bad), 16)])
		}
	}
}
