package envoytest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// procServer is a real ext_proc gRPC server playing kvroute's part. Each
// stream runs script; every message received is recorded in order.
type procServer struct {
	extprocsvc.UnimplementedExternalProcessorServer
	addr   string
	script func(*procSession) error

	mu       sync.Mutex
	sessions []*procSession
	ended    chan *procSession
}

// procSession is one ext_proc stream as the server sees it.
type procSession struct {
	stream extprocsvc.ExternalProcessor_ProcessServer

	mu       sync.Mutex
	received []*extprocsvc.ProcessingRequest
	recvAt   []time.Time
	sentAt   []time.Time
	endErr   error // what Recv returned at the end (io.EOF for a clean half-close)
}

func startProcServer(t testing.TB, script func(*procSession) error) *procServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &procServer{addr: ln.Addr().String(), script: script, ended: make(chan *procSession, 64)}
	srv := grpc.NewServer()
	extprocsvc.RegisterExternalProcessorServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return p
}

func (p *procServer) Process(stream extprocsvc.ExternalProcessor_ProcessServer) error {
	s := &procSession{stream: stream}
	p.mu.Lock()
	p.sessions = append(p.sessions, s)
	p.mu.Unlock()
	err := p.script(s)
	if err == nil {
		// Like kvroute, read on until Envoy ends the stream.
		for {
			if _, rerr := s.recv(); rerr != nil {
				break
			}
		}
	}
	select {
	case p.ended <- s:
	default: // benchmarks end more streams than anyone reads
	}
	return err
}

// lastSession waits for the most recent stream to end and returns it.
func (p *procServer) lastSession(t *testing.T) *procSession {
	t.Helper()
	select {
	case s := <-p.ended:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no ext_proc stream ended")
		return nil
	}
}

func (s *procSession) recv() (*extprocsvc.ProcessingRequest, error) {
	m, err := s.stream.Recv()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.endErr = err
		return nil, err
	}
	s.received = append(s.received, m)
	s.recvAt = append(s.recvAt, time.Now())
	return m, nil
}

func (s *procSession) send(r *extprocsvc.ProcessingResponse) error {
	s.mu.Lock()
	s.sentAt = append(s.sentAt, time.Now())
	s.mu.Unlock()
	return s.stream.Send(r)
}

// kinds lists the received message kinds in order.
func (s *procSession) kinds() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, m := range s.received {
		switch v := m.GetRequest().(type) {
		case *extprocsvc.ProcessingRequest_RequestHeaders:
			out = append(out, "request_headers")
		case *extprocsvc.ProcessingRequest_RequestBody:
			if v.RequestBody.GetEndOfStream() {
				out = append(out, "request_body_eos")
			} else {
				out = append(out, "request_body")
			}
		case *extprocsvc.ProcessingRequest_RequestTrailers:
			out = append(out, "request_trailers")
		case *extprocsvc.ProcessingRequest_ResponseHeaders:
			out = append(out, "response_headers")
		case *extprocsvc.ProcessingRequest_ResponseBody:
			if v.ResponseBody.GetEndOfStream() {
				out = append(out, "response_body_eos")
			} else {
				out = append(out, "response_body")
			}
		case *extprocsvc.ProcessingRequest_ResponseTrailers:
			out = append(out, "response_trailers")
		}
	}
	return out
}

func headerValue(hm *corev3.HeaderMap, key string) (string, bool) {
	for _, h := range hm.GetHeaders() {
		if h.GetKey() == key {
			return string(h.GetRawValue()), true
		}
	}
	return "", false
}

func setHeaders(kv ...string) *extprocsvc.HeaderMutation {
	hm := &extprocsvc.HeaderMutation{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])}})
	}
	return hm
}

func common(hm *extprocsvc.HeaderMutation, clear bool) *extprocsvc.CommonResponse {
	return &extprocsvc.CommonResponse{HeaderMutation: hm, ClearRouteCache: clear}
}

func streamed(body []byte, eos bool) *extprocsvc.CommonResponse {
	return &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{
		Mutation: &extprocsvc.BodyMutation_StreamedResponse{StreamedResponse: &extprocsvc.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}
}

// router is a kvroute-like script: it decides the routing headers from the
// request headers and body (decide), answers in the phase and shape the
// stream's body modes need, and passes the response through unchanged
// (transform may rewrite duplex response chunks).
type router struct {
	decide func(headers *corev3.HeaderMap, body []byte) *extprocsvc.HeaderMutation
	clear  bool
	// meta, when set, is the dynamic_metadata sent with the routing answer.
	meta       func(headers *corev3.HeaderMap, body []byte) *structpb.Struct
	transform  func([]byte) []byte
	reqChunker func([]byte) [][]byte // how the duplex body is streamed back upstream
}

func (rt router) script(s *procSession) error {
	var cfg *extprocsvc.ProtocolConfiguration
	var headers *corev3.HeaderMap
	var body []byte
	duplex := func(m extprocv3.ProcessingMode_BodySendMode) bool {
		return m == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	dynMeta := func() *structpb.Struct {
		if rt.meta == nil {
			return nil
		}
		return rt.meta(headers, body)
	}
	answerHeaders := func() error {
		return s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocsvc.HeadersResponse{Response: common(rt.decide(headers, body), rt.clear)}}, DynamicMetadata: dynMeta()})
	}
	streamBody := func(eos bool) error {
		chunks := [][]byte{body}
		if rt.reqChunker != nil {
			chunks = rt.reqChunker(body)
		}
		for i, c := range chunks {
			last := i == len(chunks)-1
			if err := s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestBody{
				RequestBody: &extprocsvc.BodyResponse{Response: streamed(c, eos && last)}}}); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		m, err := s.recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.GetProtocolConfig() != nil {
			cfg = m.GetProtocolConfig()
		}
		switch v := m.GetRequest().(type) {
		case *extprocsvc.ProcessingRequest_RequestHeaders:
			headers = v.RequestHeaders.GetHeaders()
			if v.RequestHeaders.GetEndOfStream() || cfg.GetRequestBodyMode() == extprocv3.ProcessingMode_NONE {
				err = answerHeaders()
			} else if !duplex(cfg.GetRequestBodyMode()) {
				err = s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestHeaders{
					RequestHeaders: &extprocsvc.HeadersResponse{}}})
			}
		case *extprocsvc.ProcessingRequest_RequestBody:
			body = append(body, v.RequestBody.GetBody()...)
			switch {
			case duplex(cfg.GetRequestBodyMode()) && v.RequestBody.GetEndOfStream():
				if err = answerHeaders(); err == nil {
					err = streamBody(true)
				}
			case !duplex(cfg.GetRequestBodyMode()):
				err = s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestBody{
					RequestBody: &extprocsvc.BodyResponse{Response: common(rt.decide(headers, body), rt.clear)}}, DynamicMetadata: dynMeta()})
			}
		case *extprocsvc.ProcessingRequest_RequestTrailers:
			if err = answerHeaders(); err == nil {
				if err = streamBody(false); err == nil {
					err = s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestTrailers{
						RequestTrailers: &extprocsvc.TrailersResponse{HeaderMutation: setHeaders("x-proc-trailer", "seen")}}})
				}
			}
		case *extprocsvc.ProcessingRequest_ResponseHeaders:
			err = s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocsvc.HeadersResponse{Response: common(setHeaders("x-kvroute", "seen"), false)}}})
		case *extprocsvc.ProcessingRequest_ResponseBody:
			chunk := v.ResponseBody.GetBody()
			if duplex(cfg.GetResponseBodyMode()) {
				if rt.transform != nil {
					chunk = rt.transform(chunk)
				}
				err = s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseBody{
					ResponseBody: &extprocsvc.BodyResponse{Response: streamed(chunk, v.ResponseBody.GetEndOfStream())}}})
			} else {
				err = s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseBody{
					ResponseBody: &extprocsvc.BodyResponse{}}})
			}
		case *extprocsvc.ProcessingRequest_ResponseTrailers:
			err = s.send(&extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseTrailers{
				ResponseTrailers: &extprocsvc.TrailersResponse{HeaderMutation: setHeaders("x-proc-response-trailer", "seen")}}})
		}
		if err != nil {
			return err
		}
	}
}
