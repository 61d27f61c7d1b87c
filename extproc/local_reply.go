package extproc

import (
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// AttributesNamespace is the key under which Envoy sends the attributes
// the ext_proc filter's request_attributes and response_attributes ask
// for (ProcessingRequest.attributes).
const AttributesNamespace = "envoy.filters.http.ext_proc"

// CodeDetailsAttribute is the response attribute that tells who made the
// response: "via_upstream" for the worker's own, otherwise the reason of
// Envoy's local reply ("no_healthy_upstream",
// "upstream_reset_before_response_started{connection_failure|...}", ...).
// The shipped bootstraps ask for it.
const CodeDetailsAttribute = "response.code_details"

// responseDetails returns the response's code details, "" when the data
// plane did not send them.
func responseDetails(m *pb.ProcessingRequest) string {
	return m.GetAttributes()[AttributesNamespace].GetFields()[CodeDetailsAttribute].GetStringValue()
}

// classify5xx says whose fault a 5xx response is. Without code details (a
// data plane that does not send them) every 5xx counts against the worker,
// as there is no telling. With them, only the worker's own response and a
// connection the worker refused or reset count; whatever else Envoy
// answered by itself (no healthy host, circuit breaker overflow, timeouts,
// no cluster) is a local reply.
func classify5xx(details string) Outcome {
	switch {
	case details == "", details == "via_upstream":
		return OutcomeUpstreamError
	case strings.HasPrefix(details, "upstream_reset_before_response_started"):
		// {connection_failure...}, {remote_reset}, {connection_termination},
		// {remote_refused_stream_reset}: the worker's end of the connection.
		// {overflow} and {connection_timeout} are Envoy's limits.
		if strings.Contains(details, "overflow") || strings.Contains(details, "timeout") {
			return OutcomeLocalReply
		}
		return OutcomeUpstreamError
	}
	return OutcomeLocalReply
}
