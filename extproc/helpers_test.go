package extproc

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// fleetDecider is a small real Decider for stream tests: it picks the first
// worker of a fixed list that the subset hint allows, and records each
// request and ticket event.
type fleetDecider struct {
	mu      sync.Mutex
	workers []Decision
	err     error
	block   bool // wait for ctx before answering
	seen    []Request
	tickets []*recTicket
}

func newFleet() *fleetDecider {
	return &fleetDecider{workers: []Decision{
		{Cluster: "w0", Address: "10.0.0.1:8000", Mode: "kv", Model: "m"},
		{Cluster: "w1", Address: "10.0.0.2:8000", Mode: "kv", Model: "m"},
		{Cluster: "w2", Address: "10.0.0.3:8000", Mode: "kv", Model: "m"},
	}}
}

func (f *fleetDecider) Decide(ctx context.Context, r *Request) (Decision, error) {
	f.mu.Lock()
	cp := *r
	cp.Body = slices.Clone(r.Body)
	f.seen = append(f.seen, cp)
	err, block := f.err, f.block
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return Decision{}, ctx.Err()
	}
	if err != nil {
		return Decision{}, err
	}
	var ok []Decision
	for _, w := range f.workers {
		if !r.HasSubset || slices.Contains(r.Subset, w.Address) {
			ok = append(ok, w)
		}
	}
	if len(ok) == 0 {
		return Decision{}, ErrNoWorker("no worker in the subset")
	}
	d := ok[0]
	for _, fb := range ok[1:] {
		d.Fallbacks = append(d.Fallbacks, fb.Address)
	}
	d.CachedTokens = 32
	t := &recTicket{}
	d.Ticket = t
	f.mu.Lock()
	f.tickets = append(f.tickets, t)
	f.mu.Unlock()
	return d, nil
}

func (f *fleetDecider) lastTicket() *recTicket {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tickets) == 0 {
		return nil
	}
	return f.tickets[len(f.tickets)-1]
}

// recTicket records what the stream told it.
type recTicket struct {
	mu       sync.Mutex
	prefill  int
	started  int // ResponseStarted calls
	progress int
	served   []string
	frees    []Outcome
}

func (t *recTicket) PrefillDone()     { t.mu.Lock(); t.prefill++; t.mu.Unlock() }
func (t *recTicket) ResponseStarted() { t.mu.Lock(); t.started++; t.mu.Unlock() }

func (t *recTicket) responseStarts() int { t.mu.Lock(); defer t.mu.Unlock(); return t.started }
func (t *recTicket) Progress(n int) {
	t.mu.Lock()
	t.progress += n
	t.mu.Unlock()
}
func (t *recTicket) Served(a string) { t.mu.Lock(); t.served = append(t.served, a); t.mu.Unlock() }
func (t *recTicket) Free(o Outcome)  { t.mu.Lock(); t.frees = append(t.frees, o); t.mu.Unlock() }

func (t *recTicket) snapshot() (prefill, progress int, served []string, frees []Outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prefill, t.progress, slices.Clone(t.served), slices.Clone(t.frees)
}

// Message builders, as Envoy sends them.

type hdr struct{ k, v string }

func headerMsg(mode, respMode BodyMode, eos bool, hs ...hdr) *pb.ProcessingRequest {
	return &pb.ProcessingRequest{
		Request: &pb.ProcessingRequest_RequestHeaders{RequestHeaders: &pb.HttpHeaders{
			Headers: headerMapOf(hs...), EndOfStream: eos,
		}},
		ProtocolConfig: &pb.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: respMode},
	}
}

func chatHeaders(mode BodyMode, extra ...hdr) *pb.ProcessingRequest {
	hs := append([]hdr{{":method", "POST"}, {":path", "/v1/chat/completions"}, {"content-type", "application/json"}}, extra...)
	return headerMsg(mode, ModeNone, false, hs...)
}

func headerMapOf(hs ...hdr) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, h := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: h.k, RawValue: []byte(h.v)})
	}
	return m
}

func reqBody(b string, eos bool) *pb.ProcessingRequest {
	return &pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestBody{RequestBody: &pb.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func reqTrailers() *pb.ProcessingRequest {
	return &pb.ProcessingRequest{Request: &pb.ProcessingRequest_RequestTrailers{RequestTrailers: &pb.HttpTrailers{}}}
}

func respHeaders(code string, eos bool) *pb.ProcessingRequest {
	return &pb.ProcessingRequest{Request: &pb.ProcessingRequest_ResponseHeaders{ResponseHeaders: &pb.HttpHeaders{
		Headers: headerMapOf(hdr{":status", code}), EndOfStream: eos,
	}}}
}

func respBody(b string, eos bool) *pb.ProcessingRequest {
	return &pb.ProcessingRequest{Request: &pb.ProcessingRequest_ResponseBody{ResponseBody: &pb.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func respTrailers() *pb.ProcessingRequest {
	return &pb.ProcessingRequest{Request: &pb.ProcessingRequest_ResponseTrailers{ResponseTrailers: &pb.HttpTrailers{}}}
}

func withSubset(m *pb.ProcessingRequest, eps ...string) *pb.ProcessingRequest {
	vals := make([]any, len(eps))
	for i, e := range eps {
		vals[i] = e
	}
	st, err := structpb.NewStruct(map[string]any{SubsetHintKey: vals})
	if err != nil {
		panic(err)
	}
	m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetHintNamespace: st}}
	return m
}

func withServed(m *pb.ProcessingRequest, ep string) *pb.ProcessingRequest {
	st, _ := structpb.NewStruct(map[string]any{ServedKey: ep})
	m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBMetadataNamespace: st}}
	return m
}

// route is what a response tells Envoy about the route.
type route struct {
	set      map[string]string
	overwr   map[string]bool
	removed  []string
	clear    bool
	metadata string
}

func routeOf(r *pb.ProcessingResponse) (route, bool) {
	var c *pb.CommonResponse
	switch r.Response.(type) {
	case *pb.ProcessingResponse_RequestHeaders, *pb.ProcessingResponse_RequestBody:
		c = commonOf(r)
	}
	if c.GetHeaderMutation() == nil {
		return route{}, false
	}
	rt := route{set: map[string]string{}, overwr: map[string]bool{}, removed: c.GetHeaderMutation().GetRemoveHeaders(), clear: c.GetClearRouteCache()}
	for _, h := range c.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetValue() != "" {
			panic("header written with value instead of raw_value: " + h.GetHeader().GetKey())
		}
		rt.set[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
		rt.overwr[h.GetHeader().GetKey()] = h.GetAppendAction() == corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	}
	rt.metadata = r.GetDynamicMetadata().GetFields()[LBMetadataNamespace].GetStructValue().GetFields()[DestinationHeader].GetStringValue()
	return rt, true
}

// kind names a response's oneof for compact expectations.
func kind(r *pb.ProcessingResponse) string {
	switch x := r.Response.(type) {
	case *pb.ProcessingResponse_RequestHeaders:
		if x.RequestHeaders.GetResponse().GetHeaderMutation() != nil {
			return "req_headers+route"
		}
		return "req_headers"
	case *pb.ProcessingResponse_RequestBody:
		if sr := x.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
			if sr.GetEndOfStream() {
				return "req_chunk_eos"
			}
			return "req_chunk"
		}
		if x.RequestBody.GetResponse().GetHeaderMutation() != nil {
			return "req_body+route"
		}
		return "req_body"
	case *pb.ProcessingResponse_RequestTrailers:
		return "req_trailers"
	case *pb.ProcessingResponse_ResponseHeaders:
		return "resp_headers"
	case *pb.ProcessingResponse_ResponseBody:
		if sr := x.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
			if sr.GetEndOfStream() {
				return "resp_chunk_eos"
			}
			return "resp_chunk"
		}
		return "resp_body"
	case *pb.ProcessingResponse_ResponseTrailers:
		return "resp_trailers"
	case *pb.ProcessingResponse_ImmediateResponse:
		return "immediate"
	}
	return "?"
}

func kinds(rs []*pb.ProcessingResponse) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = kind(r)
	}
	return out
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
