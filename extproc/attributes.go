package extproc

import (
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Request attributes the bootstraps ask Envoy for when they skip the
// request headers (request_attributes); they arrive with the body, in
// ProcessingRequest.attributes under AttributesNamespace.
const (
	RequestIDAttribute     = "request.id"
	RequestPathAttribute   = "request.path"
	RequestMethodAttribute = "request.method"
	// requestHeaderAttribute is the prefix of a CEL index into the request
	// headers: request.headers['name'].
	requestHeaderAttribute = "request.headers['"
)

// attributeHeaders turns the request attributes into the header map a
// stream keeps (Request.Headers): request.path and request.method as the
// :path and :method pseudo-headers, request.id as x-request-id, and each
// request.headers['name'] as name. Anything else, a value that is not a
// string, and a header name that is not a lower-case token are left out.
func attributeHeaders(attrs *structpb.Struct) map[string]string {
	out := map[string]string{}
	for k, v := range attrs.GetFields() {
		sv, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			continue
		}
		switch {
		case k == RequestPathAttribute:
			out[":path"] = sv.StringValue
		case k == RequestMethodAttribute:
			out[":method"] = sv.StringValue
		case k == RequestIDAttribute:
			out[RequestIDHeader] = sv.StringValue
		case len(k) >= len(requestHeaderAttribute)+len("']") && strings.HasPrefix(k, requestHeaderAttribute) && strings.HasSuffix(k, "']"):
			name := k[len(requestHeaderAttribute) : len(k)-2]
			if headerToken(name) {
				out[name] = sv.StringValue
			}
		}
	}
	return out
}

// headerToken reports whether name is a non-empty lower-case HTTP header
// name: RFC 9110 token characters but no upper case, and no quote, which
// would end the CEL string the name sits in.
func headerToken(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
