package extproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Request is what the stream knows about one HTTP request when it asks for a
// routing decision. The stream owns Body until Decide returns; a Decider must
// not keep it.
type Request struct {
	// Method and Path come from the :method and :path pseudo-headers; Path
	// keeps its query string.
	Method, Path string
	// Headers holds the request headers by lower-case name (first value
	// wins), read from raw_value with value as the fallback. Pseudo-headers
	// are included.
	Headers map[string]string
	// Body is the request body. It is nil when the body mode gives the
	// router no body (NONE, STREAMED); HasBody tells the two cases apart.
	Body    []byte
	HasBody bool
	// Truncated is set when Envoy sent only the first part of the body
	// (BUFFERED_PARTIAL); a Decider should not reject what it cannot parse.
	Truncated bool
	// Subset is the Gateway API subset hint: when HasSubset is set, only
	// endpoints (ip:port) in Subset may be chosen, and an empty Subset means
	// none may.
	Subset    []string
	HasSubset bool
}

// Header returns the named request header (lower-case name) or "".
func (r *Request) Header(name string) string { return r.Headers[name] }

// Decision is the worker a Decider chose.
type Decision struct {
	// Cluster is the chosen worker's Envoy cluster name.
	Cluster string
	// Address is the chosen worker's ip:port.
	Address string
	// Fallbacks are the next-best workers' ip:port, best first.
	Fallbacks []string
	// Worker is the chosen worker's id, for the request log and the
	// optional x-kvroute-worker response header; empty falls back to
	// Cluster.
	Worker string
	// Model is the request's model, for logs and metrics.
	Model string
	// Mode names the router mode that decided.
	Mode string
	// CachedTokens is how many prompt tokens the chosen worker already holds.
	CachedTokens int
	// Predicted says CachedTokens comes from matching the prompt against a
	// KV index; false when the request was routed without its prompt or by
	// a mode that does not look at caches.
	Predicted bool
	// Ticket tracks the request's load on the worker until the response
	// ends. It may be nil when the Decider keeps no load.
	Ticket Ticket
	// Explanation, when not nil, is the decision with every candidate's
	// terms (JSON-encodable), kept by the request log.
	Explanation any
	// Body, when not nil, replaces the request body sent upstream (an
	// ext_proc body mutation; content-length is dropped). It is honoured
	// only when the router held the whole body: BUFFERED without
	// truncation, and FULL_DUPLEX_STREAMED. The multimodal router uses it
	// to add each image's uuid.
	Body []byte
}

// Outcome says how a request's life ended, for Ticket.Free.
type Outcome string

// Outcomes a stream reports.
const (
	// OutcomeOK: the response ended normally.
	OutcomeOK Outcome = "ok"
	// OutcomeErrorStatus: the upstream answered with a 4xx status.
	OutcomeErrorStatus Outcome = "error_status"
	// OutcomeUpstreamError: the response was a 5xx, the worker's own or
	// Envoy's local reply for a connection the worker refused or reset
	// before the response headers. Passive health counts it against the
	// worker.
	OutcomeUpstreamError Outcome = "upstream_error"
	// OutcomeLocalReply: a 5xx the proxy made up itself without the
	// worker at fault: no healthy upstream, a circuit breaker's overflow,
	// a timeout, a missing cluster. It says nothing about the worker.
	OutcomeLocalReply Outcome = "local_reply"
	// OutcomeReset: the stream ended before the response did (client
	// cancel, reset, protocol error, router shutdown).
	OutcomeReset Outcome = "reset"
)

// Ticket is the response-path handle on a routed request. The stream calls
// its methods from one goroutine, and Free exactly once.
type Ticket interface {
	// PrefillDone marks the first response body byte: the prompt's prefill
	// ended.
	PrefillDone()
	// ResponseStarted marks response headers after which the stream sees
	// no body (response body mode NONE). Engines send a streamed answer's
	// headers before its first token, so this is no sign the prefill
	// ended.
	ResponseStarted()
	// Progress reports n more streamed (SSE) events, roughly output tokens.
	Progress(n int)
	// Served reports the endpoint Envoy really used (the Gateway API
	// served-endpoint report) when it differs from the primary choice.
	Served(address string)
	// Free releases the request's load.
	Free(outcome Outcome)
}

// Decider picks a worker for a request. Decide may block (an admission
// queue) and must return when ctx ends. Errors that should reach the client
// with a particular status are *HTTPError; any other error becomes a 500.
type Decider interface {
	Decide(ctx context.Context, req *Request) (Decision, error)
}

// HTTPError is a rejection the client sees as an OpenAI-style JSON error body
// in an immediate response.
type HTTPError struct {
	// Status is the HTTP status code.
	Status int
	// Type and Code fill the OpenAI error object's "type" and "code".
	Type, Code string
	// Message is the human-readable explanation. It never holds prompt text.
	Message string
	// Err is the underlying cause, if any; it is not shown to the client.
	Err error
}

func (e *HTTPError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

func (e *HTTPError) Unwrap() error { return e.Err }

// ErrNoFleet is what a Decider returns when it knows no worker at all:
// discovery has not answered since the router started and no fleet was
// restored. The stream then fails with gRPC UNAVAILABLE instead of
// answering, so the data plane does what it does when the router is down:
// with failure_mode_allow it routes without the router, otherwise it
// answers with its own error (the bootstraps give it an OpenAI-style body).
var ErrNoFleet = errors.New("no worker known yet")

// ErrNoWorker returns the 503 a Decider gives when no worker can serve.
func ErrNoWorker(msg string) *HTTPError {
	return &HTTPError{Status: http.StatusServiceUnavailable, Type: "service_unavailable_error", Code: "no_worker", Message: msg}
}

// ErrShed returns the 429 a Decider gives when its admission queue sheds.
func ErrShed(msg string) *HTTPError {
	return &HTTPError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", Message: msg}
}

// ErrBadBody returns the 400 a Decider gives for a body it cannot parse.
// When cause wraps a 400 *HTTPError, that error's message is the more
// precise one and is returned (a copy) instead of msg.
func ErrBadBody(msg string, cause error) *HTTPError {
	if he, ok := errors.AsType[*HTTPError](cause); ok && he.Status == http.StatusBadRequest {
		c := *he
		return &c
	}
	return &HTTPError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_body", Message: msg, Err: cause}
}

// errTooLarge is the 413 the stream gives for a body over the limit.
func errTooLarge(limit int) *HTTPError {
	return &HTTPError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("request body exceeds the router's limit of %d bytes", limit)}
}

// errInvalidRoute is the 502 for a decision whose worker cannot be named
// in a header (a record that should have been refused at discovery).
func errInvalidRoute() *HTTPError {
	return &HTTPError{Status: http.StatusBadGateway, Type: "server_error", Code: "invalid_route",
		Message: "the router chose a worker whose cluster or address is not a valid header value"}
}

// asHTTPError turns any Decide error into the rejection the client sees.
func asHTTPError(err error) *HTTPError {
	var he *HTTPError
	if errors.As(err, &he) {
		return he
	}
	return &HTTPError{Status: http.StatusInternalServerError, Type: "server_error", Code: "routing_failed",
		Message: "the router could not choose a worker", Err: err}
}
