package extproc

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// BodyMode is Envoy's body send mode, as the filter announces it in
// protocol_config.
type BodyMode = extprocmode.ProcessingMode_BodySendMode

// Body modes the stream handles.
const (
	ModeNone           = extprocmode.ProcessingMode_NONE
	ModeStreamed       = extprocmode.ProcessingMode_STREAMED
	ModeBuffered       = extprocmode.ProcessingMode_BUFFERED
	ModeBufferedPart   = extprocmode.ProcessingMode_BUFFERED_PARTIAL
	ModeFullDuplex     = extprocmode.ProcessingMode_FULL_DUPLEX_STREAMED
	ModeGRPC           = extprocmode.ProcessingMode_GRPC
	defaultChunkSize   = 62000
	defaultMaxBodySize = 16 << 20
)

type phase int

const (
	phHeaders  phase = iota // waiting for request_headers
	phReqBody               // collecting the request body (BUFFERED*, FULL_DUPLEX_STREAMED)
	phReqPass               // routed on headers; request body chunks pass through (STREAMED)
	phRouted                // request done and routed; waiting for response_headers
	phRespBody              // response headers seen; body or trailers may follow
	phDone                  // response ended, or an immediate response was sent
)

var phaseNames = [...]string{"request_headers", "request_body", "request_passthrough", "routed", "response_body", "done"}

func (p phase) String() string { return phaseNames[p] }

// Stream is the state of one ext_proc stream, which Envoy opens per HTTP
// request. It is a pure state machine: Step takes each message Envoy sends
// and returns the responses to send back, in order; I/O stays with the
// caller. A Stream is used by one goroutine.
type Stream struct {
	cfg *Config
	dec Decider

	phase             phase
	reqMode, respMode BodyMode
	req               Request
	body              []byte
	decision          Decision
	routed            bool
	immediate         bool
	respStatus        int
	sawRespBody       bool
	freed             bool
	served            bool
	// observed: the response headers reach the stream through Observe
	// (the observing filter's stream), not through Step; the stream's end
	// is the response's end (ResponsePathObserved).
	observed        bool
	sse             sseCounter
	immediateStatus int

	// The request log's bookkeeping (Config.Requests).
	logged             bool
	logHandle          uint64
	decidedAt, firstAt time.Time
}

// NewStream returns the state machine for one ext_proc stream. cfg must not
// change while the stream lives.
func NewStream(cfg *Config, d Decider) *Stream {
	return &Stream{cfg: cfg, dec: d}
}

// SetResponseObserved tells the stream that Envoy sends it nothing of the
// response but, at most, trailers: the response headers come through
// Observe, from the observing filter's stream, and the stream's end is the
// response's end. Call it before the first Step.
func (s *Stream) SetResponseObserved() { s.observed = true }

// Observed reports whether SetResponseObserved was called.
func (s *Stream) Observed() bool { return s.observed }

// Observe applies the response headers the observing filter saw (a
// response_headers message in observability mode) to a routed stream, as
// if they had come on the stream itself. It reports whether they were
// applied: false before the routing decision, after an immediate response,
// and for anything but response headers.
func (s *Stream) Observe(m *pb.ProcessingRequest) bool {
	h := m.GetResponseHeaders()
	if h == nil || !s.routed || s.phase != phRouted {
		return false
	}
	_, err := s.onResponseHeaders(m, h)
	return err == nil
}

// Phase names where the stream is, for logs.
func (s *Stream) Phase() string { return s.phase.String() }

// Done reports whether the HTTP exchange is over: the response ended or an
// immediate response was sent.
func (s *Stream) Done() bool { return s.phase == phDone }

// Decision returns the routing decision, once made.
func (s *Stream) Decision() (Decision, bool) { return s.decision, s.routed }

// Status returns the HTTP status of the immediate response the stream sent,
// or 0.
func (s *Stream) Status() int { return s.immediateStatus }

// Step handles one message from Envoy and returns the responses to send, in
// order. A non-nil error is a gRPC status error: the caller ends the stream
// with it, and must call Close.
func (s *Stream) Step(ctx context.Context, m *pb.ProcessingRequest) ([]*pb.ProcessingResponse, error) {
	out, err := s.step(ctx, m)
	if err != nil {
		s.release(OutcomeReset)
		return nil, err
	}
	if m.GetObservabilityMode() {
		return nil, nil
	}
	return out, nil
}

// Close ends the stream: a request whose response did not end normally has
// its load released. err is what ended the gRPC stream (nil or io.EOF for a
// clean half-close by Envoy).
func (s *Stream) Close(err error) {
	if s.freed || (s.decision.Ticket == nil && !s.logged) {
		return
	}
	// With response body mode NONE Envoy never shows the response's end; the
	// stream's end is that signal. Envoy closes it, cleanly or by cancelling
	// it, when the HTTP request ends; a client that leaves mid-response
	// looks the same from here.
	// Observed, with no response headers from the observing filter:
	// nothing says the response failed.
	if s.AwaitsEnd() && s.respStatus < 400 && endedByEnvoy(err) {
		s.release(OutcomeOK)
		return
	}
	s.release(OutcomeReset)
}

// AwaitsEnd reports whether the stream waits for nothing but its end: the
// response headers came and, with response body mode NONE, Envoy sends
// nothing more (trailers at most) until it closes the stream when the
// request ends, however long the response takes.
func (s *Stream) AwaitsEnd() bool {
	return s.phase == phRespBody && s.respMode == ModeNone || s.observed && s.phase == phRouted
}

// endedByEnvoy tells a stream Envoy closed (half-close, or a cancel when
// its HTTP request ends) from one that failed.
func endedByEnvoy(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled
}

func (s *Stream) step(ctx context.Context, m *pb.ProcessingRequest) ([]*pb.ProcessingResponse, error) {
	if s.phase == phDone && s.immediate {
		// Envoy may still deliver chunks it sent before our immediate
		// response reached it; they need no answer.
		return nil, nil
	}
	switch r := m.GetRequest().(type) {
	case *pb.ProcessingRequest_RequestHeaders:
		return s.onRequestHeaders(ctx, m, r.RequestHeaders)
	case *pb.ProcessingRequest_RequestBody:
		return s.onRequestBody(ctx, m, r.RequestBody)
	case *pb.ProcessingRequest_RequestTrailers:
		return s.onRequestTrailers(ctx)
	case *pb.ProcessingRequest_ResponseHeaders:
		return s.onResponseHeaders(m, r.ResponseHeaders)
	case *pb.ProcessingRequest_ResponseBody:
		return s.onResponseBody(m, r.ResponseBody)
	case *pb.ProcessingRequest_ResponseTrailers:
		return s.onResponseTrailers(m)
	case nil:
		return nil, status.Error(codes.InvalidArgument, "ext_proc: message carries no request (flow-control-only messages are not supported)")
	default:
		return nil, status.Errorf(codes.InvalidArgument, "ext_proc: unsupported message %T", r)
	}
}

func (s *Stream) outOfOrder(what string) error {
	return status.Errorf(codes.FailedPrecondition, "ext_proc: %s not expected in phase %s", what, s.phase)
}

func (s *Stream) onRequestHeaders(ctx context.Context, m *pb.ProcessingRequest, h *pb.HttpHeaders) ([]*pb.ProcessingResponse, error) {
	if s.phase != phHeaders {
		return nil, s.outOfOrder("request_headers")
	}
	s.reqMode, s.respMode = s.cfg.DefaultRequestMode, ModeNone
	if pc := m.GetProtocolConfig(); pc != nil {
		s.reqMode, s.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	if s.reqMode == ModeGRPC || s.respMode == ModeGRPC {
		return nil, status.Error(codes.Unimplemented, "ext_proc: GRPC body send mode is not supported; use FULL_DUPLEX_STREAMED or BUFFERED")
	}
	s.req.Headers = headerMap(h.GetHeaders())
	s.req.Method, s.req.Path = s.req.Headers[":method"], s.req.Headers[":path"]
	s.req.Subset, s.req.HasSubset = subsetHint(m.GetMetadataContext())
	if cl, err := strconv.ParseInt(s.req.Headers["content-length"], 10, 64); err == nil && cl > int64(s.cfg.maxBody()) {
		return s.reject(errTooLarge(s.cfg.maxBody())), nil
	}

	bodyless := h.GetEndOfStream()
	switch {
	case bodyless || s.reqMode == ModeNone || s.reqMode == ModeStreamed:
		// Route on headers and load alone.
		if err := s.decide(ctx); err != nil {
			return s.rejectOrFail(err)
		}
		resp := &pb.ProcessingResponse{Response: &pb.ProcessingResponse_RequestHeaders{RequestHeaders: &pb.HeadersResponse{Response: s.routeCommon()}}, DynamicMetadata: s.routeMetadata()}
		s.phase = phRouted
		if !bodyless && s.reqMode == ModeStreamed {
			s.phase = phReqPass
		}
		return []*pb.ProcessingResponse{resp}, nil
	case s.reqMode == ModeFullDuplex:
		// The headers response waits until the whole body is in.
		s.phase = phReqBody
		return nil, nil
	default: // BUFFERED, BUFFERED_PARTIAL
		s.phase = phReqBody
		return []*pb.ProcessingResponse{{Response: &pb.ProcessingResponse_RequestHeaders{RequestHeaders: &pb.HeadersResponse{}}}}, nil
	}
}

func (s *Stream) onRequestBody(ctx context.Context, m *pb.ProcessingRequest, b *pb.HttpBody) ([]*pb.ProcessingResponse, error) {
	switch s.phase {
	case phHeaders:
		// Envoy skipped the request headers (request_header_mode SKIP):
		// what the router reads of them came as request attributes.
		if err := s.startFromBody(m); err != nil {
			return nil, err
		}
	case phReqPass:
		if b.GetEndOfStream() {
			s.phase = phRouted
		}
		return []*pb.ProcessingResponse{bodyContinue(true)}, nil
	case phReqBody:
	default:
		return nil, s.outOfOrder("request_body")
	}
	if len(s.body)+len(b.GetBody()) > s.cfg.maxBody() {
		return s.reject(errTooLarge(s.cfg.maxBody())), nil
	}
	s.body = append(s.body, b.GetBody()...)
	if s.reqMode == ModeFullDuplex {
		if !b.GetEndOfStream() {
			return nil, nil
		}
		return s.finishDuplex(ctx, true)
	}
	// BUFFERED sends the whole body once; BUFFERED_PARTIAL may send only
	// its first part, and the rest goes upstream without us.
	s.req.Truncated = !b.GetEndOfStream()
	if err := s.decideWithBody(ctx); err != nil {
		return s.rejectOrFail(err)
	}
	s.phase = phRouted
	common := s.routeCommon()
	if s.decision.Body != nil && !s.req.Truncated {
		common.BodyMutation = &pb.BodyMutation{Mutation: &pb.BodyMutation_Body{Body: s.decision.Body}}
		common.HeaderMutation.RemoveHeaders = append(common.HeaderMutation.RemoveHeaders, "content-length")
	}
	s.decision.Body = nil
	return []*pb.ProcessingResponse{{
		Response:        &pb.ProcessingResponse_RequestBody{RequestBody: &pb.BodyResponse{Response: common}},
		DynamicMetadata: s.routeMetadata(),
	}}, nil
}

// startFromBody begins a stream whose first message is the request body:
// the modes from protocol_config, the request line, id and priority from
// the request attributes (attributeHeaders), the subset hint from the
// message's metadata. Only a buffered body can be routed this way: the
// answer to the body is the only answer Envoy waits for.
func (s *Stream) startFromBody(m *pb.ProcessingRequest) error {
	pc := m.GetProtocolConfig()
	if pc == nil || (pc.GetRequestBodyMode() != ModeBuffered && pc.GetRequestBodyMode() != ModeBufferedPart) {
		return status.Error(codes.FailedPrecondition, "ext_proc: request body before request headers needs request_body_mode BUFFERED (announced in protocol_config)")
	}
	if pc.GetResponseBodyMode() == ModeGRPC {
		return status.Error(codes.Unimplemented, "ext_proc: GRPC body send mode is not supported; use FULL_DUPLEX_STREAMED or BUFFERED")
	}
	s.reqMode, s.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	s.req.Headers = attributeHeaders(m.GetAttributes()[AttributesNamespace])
	s.req.Method, s.req.Path = s.req.Headers[":method"], s.req.Headers[":path"]
	s.req.Subset, s.req.HasSubset = subsetHint(m.GetMetadataContext())
	s.phase = phReqBody
	return nil
}

func (s *Stream) onRequestTrailers(ctx context.Context) ([]*pb.ProcessingResponse, error) {
	switch {
	case s.phase == phReqBody && s.reqMode == ModeFullDuplex:
		return s.finishDuplex(ctx, false)
	case s.phase == phReqBody || s.phase == phReqPass || s.phase == phRouted:
		// Trailers after a buffered or passed-through body: nothing to change.
		s.phase = phRouted
		return []*pb.ProcessingResponse{{Response: &pb.ProcessingResponse_RequestTrailers{RequestTrailers: &pb.TrailersResponse{}}}}, nil
	default:
		return nil, s.outOfOrder("request_trailers")
	}
}

// finishDuplex answers a complete FULL_DUPLEX_STREAMED request: the headers
// response with the route, the body in chunks, then the trailers response
// when the request had trailers. bodyEOS says the body itself carried
// end_of_stream (no trailers follow).
func (s *Stream) finishDuplex(ctx context.Context, bodyEOS bool) ([]*pb.ProcessingResponse, error) {
	if err := s.decideWithBody(ctx); err != nil {
		return s.rejectOrFail(err)
	}
	body, common := s.body, s.routeCommon()
	if s.decision.Body != nil {
		body = s.decision.Body
		common.HeaderMutation.RemoveHeaders = append(common.HeaderMutation.RemoveHeaders, "content-length")
	}
	out := make([]*pb.ProcessingResponse, 0, 2+len(body)/s.cfg.chunkSize())
	out = append(out, &pb.ProcessingResponse{
		Response:        &pb.ProcessingResponse_RequestHeaders{RequestHeaders: &pb.HeadersResponse{Response: common}},
		DynamicMetadata: s.routeMetadata(),
	})
	out = appendStreamedBody(out, body, bodyEOS, s.cfg.chunkSize(), true)
	s.decision.Body = nil
	if !bodyEOS {
		out = append(out, &pb.ProcessingResponse{Response: &pb.ProcessingResponse_RequestTrailers{RequestTrailers: &pb.TrailersResponse{}}})
	}
	s.body = nil
	s.phase = phRouted
	return out, nil
}

func (s *Stream) decideWithBody(ctx context.Context) error {
	s.req.Body, s.req.HasBody = s.body, true
	if s.req.Body == nil {
		s.req.Body = []byte{}
	}
	err := s.decide(ctx)
	s.req.Body = nil // the Decider must not keep it; neither do we
	return err
}

func (s *Stream) decide(ctx context.Context) error {
	d, err := s.dec.Decide(ctx, &s.req)
	if err != nil {
		return err
	}
	// The values become request headers: checked once more here, where
	// they are set, whatever the Decider and its records let through.
	if !validHeaderValue(d.Cluster) || !validHeaderValue(d.Address) {
		if d.Ticket != nil {
			d.Ticket.Free(OutcomeReset)
		}
		s.cfg.logger().Warn("ext_proc: decision refused: worker cluster or address is not a valid header value",
			"cluster", strconv.Quote(d.Cluster), "address", strconv.Quote(d.Address))
		return errInvalidRoute()
	}
	d.Fallbacks = slices.DeleteFunc(d.Fallbacks, func(f string) bool { return !validHeaderValue(f) || strings.ContainsRune(f, ',') })
	s.decision, s.routed = d, true
	if s.cfg.Requests != nil {
		s.logged, s.decidedAt = true, s.cfg.now()
		s.logHandle = s.cfg.Requests.Decided(s.req.Headers[RequestIDHeader], &s.decision, nil)
		s.decision.Explanation = nil // the log holds it now
	}
	return nil
}

// rejectOrFail turns a Decide error into an immediate response, or into a
// gRPC error when the stream itself ended.
func (s *Stream) rejectOrFail(err error) ([]*pb.ProcessingResponse, error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil, status.FromContextError(err).Err()
	}
	if errors.Is(err, ErrNoFleet) {
		s.phase = phDone
		s.body = nil
		return nil, status.Error(codes.Unavailable, "ext_proc: the router knows no worker yet; the data plane's failure mode applies")
	}
	return s.reject(asHTTPError(err)), nil
}

func (s *Stream) reject(e *HTTPError) []*pb.ProcessingResponse {
	s.phase, s.immediate, s.immediateStatus = phDone, true, e.Status
	s.body = nil
	if s.cfg.Requests != nil && !s.logged {
		s.logged, s.decidedAt = true, s.cfg.now()
		s.logHandle = s.cfg.Requests.Decided(s.req.Headers[RequestIDHeader], nil, e)
	}
	s.release(OutcomeReset)
	return []*pb.ProcessingResponse{immediateResponse(e)}
}

func (s *Stream) onResponseHeaders(m *pb.ProcessingRequest, h *pb.HttpHeaders) ([]*pb.ProcessingResponse, error) {
	if s.phase != phRouted && s.phase != phReqPass {
		return nil, s.outOfOrder("response_headers")
	}
	s.noteServed(m)
	hm := h.GetHeaders()
	s.respStatus, _ = strconv.Atoi(headerValue(hm, ":status"))
	s.phase = phRespBody
	switch {
	case s.respStatus >= 500:
		s.release(classify5xx(responseDetails(m)))
	case s.respStatus >= 400:
		s.release(OutcomeErrorStatus)
	case h.GetEndOfStream():
		s.prefillDone()
		s.release(OutcomeOK)
	case s.respMode == ModeNone:
		// No body will be shown to us. The headers are the first sign of
		// life, but not of the first token: the worker's KV events tell
		// that, and the Ticket decides.
		s.responseStarted()
	}
	if h.GetEndOfStream() {
		s.phase = phDone
	}
	hr := &pb.HeadersResponse{}
	if s.cfg.ResponseWorkerHeader && s.routed {
		hr.Response = &pb.CommonResponse{HeaderMutation: &pb.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(WorkerHeader, s.workerName())}}}
	}
	return []*pb.ProcessingResponse{{Response: &pb.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}}, nil
}

// workerName is the chosen worker's id, or its cluster when the Decider
// named no id.
func (s *Stream) workerName() string {
	if s.decision.Worker != "" && validHeaderValue(s.decision.Worker) {
		return s.decision.Worker
	}
	return s.decision.Cluster
}

func (s *Stream) onResponseBody(m *pb.ProcessingRequest, b *pb.HttpBody) ([]*pb.ProcessingResponse, error) {
	if s.phase != phRespBody {
		return nil, s.outOfOrder("response_body")
	}
	s.noteServed(m)
	if !s.freed {
		s.prefillDone()
		if n := s.sse.count(b.GetBody()); n > 0 && s.decision.Ticket != nil {
			s.decision.Ticket.Progress(n)
		}
	}
	eos := b.GetEndOfStream()
	if eos {
		s.release(OutcomeOK)
		s.phase = phDone
	}
	if s.respMode == ModeFullDuplex {
		return appendStreamedBody(nil, b.GetBody(), eos, s.cfg.chunkSize(), false), nil
	}
	return []*pb.ProcessingResponse{bodyContinue(false)}, nil
}

func (s *Stream) onResponseTrailers(m *pb.ProcessingRequest) ([]*pb.ProcessingResponse, error) {
	if s.phase != phRespBody && !(s.observed && s.phase == phRouted) {
		return nil, s.outOfOrder("response_trailers")
	}
	s.noteServed(m)
	s.release(OutcomeOK)
	s.phase = phDone
	return []*pb.ProcessingResponse{{Response: &pb.ProcessingResponse_ResponseTrailers{ResponseTrailers: &pb.TrailersResponse{}}}}, nil
}

func (s *Stream) prefillDone() {
	if s.logged && s.firstAt.IsZero() {
		s.firstAt = s.cfg.now()
	}
	if s.sawRespBody || s.decision.Ticket == nil || s.freed {
		return
	}
	s.sawRespBody = true
	s.decision.Ticket.PrefillDone()
}

// responseStarted is prefillDone for response headers that no body will
// follow to the stream: the request log takes them as the first byte, the
// Ticket as no more than the response's start.
func (s *Stream) responseStarted() {
	if s.logged && s.firstAt.IsZero() {
		s.firstAt = s.cfg.now()
	}
	if s.sawRespBody || s.decision.Ticket == nil || s.freed {
		return
	}
	s.decision.Ticket.ResponseStarted()
}

func (s *Stream) noteServed(m *pb.ProcessingRequest) {
	if s.served || s.decision.Ticket == nil || s.freed {
		return
	}
	addr, ok := servedEndpoint(m.GetMetadataContext())
	if !ok {
		return
	}
	s.served = true
	if addr != s.decision.Address {
		s.decision.Ticket.Served(addr)
	}
}

func (s *Stream) release(o Outcome) {
	if s.freed {
		return
	}
	s.freed = true
	if s.decision.Ticket != nil {
		s.decision.Ticket.Free(o)
	}
	if s.logged {
		end := Finish{Status: s.respStatus, Outcome: o, Duration: s.cfg.now().Sub(s.decidedAt)}
		if s.immediate {
			end.Status = s.immediateStatus
		}
		if !s.firstAt.IsZero() {
			end.TTFT = s.firstAt.Sub(s.decidedAt)
		}
		s.cfg.Requests.Finished(s.logHandle, end)
	}
}
