package extproc

import pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

// ExchangeMetrics is what a Metrics may also implement to count the
// messages Envoy sends per request, by phase: the cost of the ext_proc hop
// (each message Envoy holds the request for is one gRPC round trip on the
// request's path) that shows without a timing run.
type ExchangeMetrics interface {
	// Exchange counts one message from Envoy. phase is one of the
	// Exchange* names; blocking is false when Envoy does not wait for the
	// answer (observability mode).
	Exchange(phase string, blocking bool)
	// StreamExchanges reports, once per ended stream, how many of its
	// messages Envoy waited on.
	StreamExchanges(blocking int)
}

// Phases of the messages ExchangeMetrics counts.
const (
	ExchangeRequestHeaders   = "request_headers"
	ExchangeRequestBody      = "request_body"
	ExchangeRequestTrailers  = "request_trailers"
	ExchangeResponseHeaders  = "response_headers"
	ExchangeResponseBody     = "response_body"
	ExchangeResponseTrailers = "response_trailers"
	ExchangeOther            = "other"
)

// exchangePhase names the phase of one message from Envoy.
func exchangePhase(m *pb.ProcessingRequest) string {
	switch m.GetRequest().(type) {
	case *pb.ProcessingRequest_RequestHeaders:
		return ExchangeRequestHeaders
	case *pb.ProcessingRequest_RequestBody:
		return ExchangeRequestBody
	case *pb.ProcessingRequest_RequestTrailers:
		return ExchangeRequestTrailers
	case *pb.ProcessingRequest_ResponseHeaders:
		return ExchangeResponseHeaders
	case *pb.ProcessingRequest_ResponseBody:
		return ExchangeResponseBody
	case *pb.ProcessingRequest_ResponseTrailers:
		return ExchangeResponseTrailers
	}
	return ExchangeOther
}
