package extproc

import (
	"encoding/json"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// headerMap reads Envoy's header map: names lower-cased, the first value
// of a repeated header kept, raw_value preferred over value (Envoy sends
// raw_value only since 1.27).
func headerMap(hm *corev3.HeaderMap) map[string]string {
	hs := hm.GetHeaders()
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		k := strings.ToLower(h.GetKey())
		if _, dup := m[k]; dup {
			continue
		}
		m[k] = rawOrValue(h)
	}
	return m
}

func rawOrValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// headerValue finds one header without building the whole map.
func headerValue(hm *corev3.HeaderMap, name string) string {
	for _, h := range hm.GetHeaders() {
		if strings.EqualFold(h.GetKey(), name) {
			return rawOrValue(h)
		}
	}
	return ""
}

// validHeaderValue reports whether v can be a routing header value: not
// empty, at most 1 KiB, and only visible ASCII (no CR, LF, NUL or other
// control bytes, no spaces). Cluster names and ip:port lists need no more.
func validHeaderValue(v string) bool {
	if v == "" || len(v) > 1024 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// setHeader writes with raw_value only, replacing any copy the client sent.
func setHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// subsetHint reads the Gateway API subset hint: ok is false when the data
// plane sent none; an empty list with ok means no endpoint is allowed.
func subsetHint(md *corev3.Metadata) (subset []string, ok bool) {
	ns := md.GetFilterMetadata()[SubsetHintNamespace]
	v, found := ns.GetFields()[SubsetHintKey]
	if !found {
		return nil, false
	}
	subset = []string{}
	switch x := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range x.ListValue.GetValues() {
			if s := strings.TrimSpace(e.GetStringValue()); s != "" {
				subset = append(subset, s)
			}
		}
	case *structpb.Value_StringValue:
		// Some data planes send one comma-separated string.
		for _, s := range strings.Split(x.StringValue, ",") {
			if s = strings.TrimSpace(s); s != "" {
				subset = append(subset, s)
			}
		}
	}
	return subset, true
}

// servedEndpoint reads the data plane's report of the endpoint that served.
func servedEndpoint(md *corev3.Metadata) (string, bool) {
	v, ok := md.GetFilterMetadata()[LBMetadataNamespace].GetFields()[ServedKey]
	if !ok {
		return "", false
	}
	s := strings.TrimSpace(v.GetStringValue())
	if i := strings.IndexByte(s, ','); i >= 0 {
		s = s[:i]
	}
	return s, s != ""
}

// destination is the Gateway API endpoint list: primary, then fallbacks.
func (s *Stream) destination() string {
	d := s.decision
	if len(d.Fallbacks) == 0 {
		return d.Address
	}
	var b strings.Builder
	b.WriteString(d.Address)
	for _, f := range d.Fallbacks {
		b.WriteByte(',')
		b.WriteString(f)
	}
	return b.String()
}

// routeCommon is the CommonResponse that carries the route to Envoy.
func (s *Stream) routeCommon() *pb.CommonResponse {
	d := s.decision
	target := d.Cluster
	if s.cfg.TargetValue == TargetAddress {
		target = d.Address
	}
	hm := &pb.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		setHeader(s.cfg.targetHeader(), target),
		setHeader(DestinationHeader, s.destination()),
	}}
	if d.Predicted {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(PredictedCachedTokensHeader, strconv.Itoa(d.CachedTokens)))
	} else {
		hm.RemoveHeaders = append(hm.RemoveHeaders, PredictedCachedTokensHeader)
	}
	if s.cfg.DebugHeaders {
		hm.SetHeaders = append(hm.SetHeaders,
			setHeader(CachedTokensHeader, strconv.Itoa(d.CachedTokens)),
			setHeader(ModeHeader, d.Mode))
	} else {
		hm.RemoveHeaders = append(hm.RemoveHeaders, CachedTokensHeader, ModeHeader)
	}
	return &pb.CommonResponse{HeaderMutation: hm, ClearRouteCache: true}
}

// routeMetadata is the dynamic metadata in envoy.lb: the destination list
// under x-gateway-destination-endpoint, identical to the header as the
// protocol requires; the target header's value under the target header's
// name, which a bootstrap that skips the request headers routes on (header
// mutations in the answer to the body do not reach the route then); and,
// with Config.ResponseWorkerHeader, the worker under x-kvroute-worker for
// the bootstrap to add to the response; and the upstream headers
// routeCommon sets, under their names.
func (s *Stream) routeMetadata() *structpb.Struct {
	target := s.decision.Cluster
	if s.cfg.TargetValue == TargetAddress {
		target = s.decision.Address
	}
	lb := map[string]*structpb.Value{
		DestinationHeader:    structpb.NewStringValue(s.destination()),
		s.cfg.targetHeader(): structpb.NewStringValue(target),
	}
	if s.cfg.ResponseWorkerHeader {
		lb[WorkerHeader] = structpb.NewStringValue(s.workerName())
	}
	// The headers routeCommon sets upstream, for a bootstrap that adds
	// them from metadata (request_headers_to_add).
	if s.decision.Predicted {
		lb[PredictedCachedTokensHeader] = structpb.NewStringValue(strconv.Itoa(s.decision.CachedTokens))
	}
	if s.cfg.DebugHeaders {
		lb[CachedTokensHeader] = structpb.NewStringValue(strconv.Itoa(s.decision.CachedTokens))
		lb[ModeHeader] = structpb.NewStringValue(s.decision.Mode)
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		LBMetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: lb}),
	}}
}

func bodyContinue(request bool) *pb.ProcessingResponse {
	if request {
		return &pb.ProcessingResponse{Response: &pb.ProcessingResponse_RequestBody{RequestBody: &pb.BodyResponse{}}}
	}
	return &pb.ProcessingResponse{Response: &pb.ProcessingResponse_ResponseBody{ResponseBody: &pb.BodyResponse{}}}
}

// appendStreamedBody returns body to Envoy as streamed_response chunks of at
// most size bytes; the last carries eos. An empty body is still one chunk so
// Envoy sees the end of stream.
func appendStreamedBody(out []*pb.ProcessingResponse, body []byte, eos bool, size int, request bool) []*pb.ProcessingResponse {
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), size)
		chunk := &pb.BodyResponse{Response: &pb.CommonResponse{BodyMutation: &pb.BodyMutation{
			Mutation: &pb.BodyMutation_StreamedResponse{StreamedResponse: &pb.StreamedBodyResponse{
				Body: body[:n:n], EndOfStream: eos && n == len(body),
			}},
		}}}
		body = body[n:]
		if request {
			out = append(out, &pb.ProcessingResponse{Response: &pb.ProcessingResponse_RequestBody{RequestBody: chunk}})
		} else {
			out = append(out, &pb.ProcessingResponse{Response: &pb.ProcessingResponse_ResponseBody{ResponseBody: chunk}})
		}
	}
	return out
}

type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// Body is the OpenAI-style JSON error the client sees:
// {"error": {"message", "type", "param", "code"}}. kvroute's HTTP endpoints
// answer errors with the same shape.
func (e *HTTPError) Body() []byte {
	body, _ := json.Marshal(openAIError{Error: openAIErrorBody{Message: e.Message, Type: e.Type, Code: e.Code}})
	return body
}

// immediateResponse answers the client directly with an OpenAI-style error.
func immediateResponse(e *HTTPError) *pb.ProcessingResponse {
	body := e.Body()
	headers := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if e.Status == 429 {
		headers = append(headers, setHeader("retry-after", "1"))
	}
	return &pb.ProcessingResponse{Response: &pb.ProcessingResponse_ImmediateResponse{ImmediateResponse: &pb.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
		Headers: &pb.HeaderMutation{SetHeaders: headers},
		Body:    body,
		Details: "kvroute_" + e.Code,
	}}}
}

// sseCounter counts server-sent events ("data:" lines other than [DONE])
// across chunk boundaries.
type sseCounter struct {
	atLineStart bool
	started     bool
	partial     []byte // a "data:" prefix split across chunks
}

func (c *sseCounter) count(b []byte) int {
	if !c.started {
		c.started, c.atLineStart = true, true
	}
	n := 0
	for i := 0; i < len(b); i++ {
		if len(c.partial) > 0 || (c.atLineStart && b[i] == 'd') {
			c.partial = append(c.partial, b[i])
			if !strings.HasPrefix("data:", string(c.partial)) {
				c.partial = c.partial[:0]
			} else if len(c.partial) == len("data:") {
				c.partial = c.partial[:0]
				if !isDone(b[i+1:]) {
					n++
				}
			}
		}
		c.atLineStart = b[i] == '\n'
	}
	return n
}

func isDone(rest []byte) bool {
	r := strings.TrimLeft(string(rest[:min(len(rest), 16)]), " ")
	return strings.HasPrefix(r, "[DONE]")
}
