package envoytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"github.com/kvroute/kvroute/envoy"
	"net"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// phase names the ext_proc message kinds in the order Envoy exchanges them.
type phase int

const (
	phRequestHeaders phase = iota
	phRequestBody
	phRequestTrailers
	phResponseHeaders
	phResponseBody
	phResponseTrailers
)

func phaseOf(r *extprocsvc.ProcessingResponse) (phase, bool) {
	switch r.GetResponse().(type) {
	case *extprocsvc.ProcessingResponse_RequestHeaders:
		return phRequestHeaders, true
	case *extprocsvc.ProcessingResponse_RequestBody:
		return phRequestBody, true
	case *extprocsvc.ProcessingResponse_RequestTrailers:
		return phRequestTrailers, true
	case *extprocsvc.ProcessingResponse_ResponseHeaders:
		return phResponseHeaders, true
	case *extprocsvc.ProcessingResponse_ResponseBody:
		return phResponseBody, true
	case *extprocsvc.ProcessingResponse_ResponseTrailers:
		return phResponseTrailers, true
	}
	return 0, false
}

// exchange is one HTTP request passing through the ext_proc filter and the
// router. All fields belong to the handler goroutine.
type exchange struct {
	g   *Gateway
	pc  *procConfig
	ctx context.Context
	w   http.ResponseWriter
	r   *http.Request

	proc       *procStream // nil once processing is complete
	stopAbort  func() bool
	hs         headerMap
	choice     routeChoice
	routeOK    bool
	clearRoute bool
	wroteHead  bool
	// meta is the request's dynamic metadata that the Gateway models (see
	// lbMetadata).
	meta lbMetadata
}

func (x *exchange) run() {
	x.hs = requestHeaderMap(x.r)
	x.meta = lbMetadata{}
	// Early header mutations run first, before routing and every filter.
	for _, h := range x.g.cfg.earlyRemove {
		x.hs.remove(h)
	}
	// Envoy picks the route before any filter runs; only clear_route_cache
	// makes it look again.
	x.choice, x.routeOK = x.g.cfg.routes.match(x.hs)
	hasBody := x.r.Body != nil && x.r.Body != http.NoBody
	defer x.endProc()
	if x.startProc() {
		return
	}
	if x.proc != nil {
		err := x.proc.send(&extprocsvc.ProcessingRequest{
			Request: &extprocsvc.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocsvc.HttpHeaders{
				Headers: x.hs.proto(), EndOfStream: !hasBody,
			}},
			Attributes:      x.requestAttributes(),
			MetadataContext: x.metadataContext(true),
		})
		if err != nil && x.procFail(err) {
			return
		}
	}
	if x.pc.mode.GetRequestBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		x.duplexRequest(hasBody)
	} else {
		x.bufferedRequest(hasBody)
	}
}

// startProc opens the ext_proc stream; true means a reply was sent instead.
func (x *exchange) startProc() bool {
	// The stream outlives the handler by the deferred-close grace, so it is
	// not tied to the request context; a client that goes away aborts it.
	p, err := openProcStream(context.WithoutCancel(x.ctx), x.g.client, x.pc)
	if err != nil {
		return x.procFail(err)
	}
	x.proc = p
	x.stopAbort = context.AfterFunc(x.ctx, p.abort)
	return false
}

func (x *exchange) endProc() {
	if x.stopAbort != nil {
		x.stopAbort()
	}
	if x.proc == nil {
		return
	}
	done := x.proc.finish(x.pc.deferredClose)
	x.g.mu.Lock()
	closed := x.g.closed
	if !closed {
		x.g.streams.Add(1)
	}
	x.g.mu.Unlock()
	if closed {
		<-done
		return
	}
	go func() { <-done; x.g.streams.Done() }()
}

// step waits for the processor's answer in one of the wanted phases. It
// returns (nil, false) when processing has stopped and the request goes on
// without the processor, and stop=true when a reply has been sent.
func (x *exchange) step(armed <-chan struct{}, want ...phase) (*extprocsvc.ProcessingResponse, bool) {
	if x.proc == nil {
		return nil, false
	}
	resp, err := x.proc.await(x.ctx, armed)
	if err != nil {
		return nil, x.procFail(err)
	}
	// Envoy keeps what the processor writes into a receiving namespace,
	// whatever the message.
	x.meta.merge(resp.GetDynamicMetadata(), x.pc.receive)
	if ir := resp.GetImmediateResponse(); ir != nil {
		x.proc.abort()
		x.proc = nil
		x.immediate(ir)
		return nil, true
	}
	ph, ok := phaseOf(resp)
	for _, w := range want {
		if ok && ph == w {
			return resp, false
		}
	}
	return nil, x.procFail(errSpurious)
}

// procFail ends processing after err and applies Envoy's policy. It returns
// true when the request is finished (an error reply was sent or the client
// is gone).
func (x *exchange) procFail(err error) bool {
	if x.proc != nil {
		x.proc.abort()
		x.proc = nil
	}
	if x.ctx.Err() != nil {
		return true
	}
	x.g.log.Warn("envoy gateway: ext_proc", "err", err, "path", x.r.URL.Path)
	switch {
	case errors.Is(err, errSpurious), errors.Is(err, errStreamClosed):
		return false // Envoy ignores the processor for the rest of the request
	case errors.Is(err, errMutation):
		x.reply(http.StatusInternalServerError, nil, nil)
		return true
	case x.pc.failureModeAllow:
		return false
	case errors.Is(err, errMessageTimeout):
		x.reply(http.StatusGatewayTimeout, nil, nil)
		return true
	}
	x.reply(http.StatusInternalServerError, nil, nil)
	return true
}

// applyCommon applies a CommonResponse's header mutation to target and
// notes clear_route_cache on the request path. It returns true when the
// mutation was refused and a 500 was sent.
func (x *exchange) applyCommon(cr *extprocsvc.CommonResponse, target *headerMap, requestPath bool) bool {
	if cr == nil {
		return false
	}
	if err := applyHeaderMutation(cr.GetHeaderMutation(), target, x.pc.rules); err != nil {
		return x.procFail(err)
	}
	if requestPath && x.pc.clearsRouteCache(cr) {
		x.clearRoute = true
	}
	return false
}

func (x *exchange) immediate(ir *extprocsvc.ImmediateResponse) {
	code := http.StatusOK
	if ir.GetStatus() != nil {
		code = int(ir.GetStatus().GetCode())
	}
	if code < 200 || code > 999 {
		code = http.StatusInternalServerError
	}
	var hs headerMap
	if err := applyHeaderMutation(ir.GetHeaders(), &hs, x.pc.rules); err != nil {
		x.reply(http.StatusInternalServerError, nil, nil)
		return
	}
	x.reply(code, hs, ir.GetBody())
}

// reply sends a local reply that does not pass through the processor. After
// the response head is out, the only thing left is to reset the stream.
func (x *exchange) reply(code int, hs headerMap, body []byte) {
	if x.wroteHead {
		panic(http.ErrAbortHandler)
	}
	h := x.w.Header()
	for _, e := range hs {
		if !strings.HasPrefix(e.key, ":") && !hopByHop[e.key] && e.key != "content-length" {
			h.Add(e.key, e.value)
		}
	}
	if len(body) > 0 && h.Get("Content-Type") == "" {
		h.Set("Content-Type", "text/plain")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	x.wroteHead = true
	x.w.WriteHeader(code)
	_, _ = x.w.Write(body)
}

func requestHeaderMap(r *http.Request) headerMap {
	path := r.RequestURI
	if path == "" || !strings.HasPrefix(path, "/") {
		path = r.URL.RequestURI()
	}
	hs := headerMap{{":authority", r.Host}, {":path", path}, {":method", r.Method}, {":scheme", "http"}}
	hs.fromHTTP(r.Header)
	if _, ok := hs.get("x-request-id"); !ok {
		hs.add("x-request-id", newRequestID())
	}
	hs.set("x-forwarded-proto", "http")
	return hs
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	s := hex.EncodeToString(b[:])
	return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:]
}

// Attributes the Gateway can fill, by Envoy's attribute names.
var (
	requestAttributes = map[string]bool{
		"request.path": true, "request.url_path": true, "request.host": true, "request.scheme": true,
		"request.method": true, "request.protocol": true, "request.id": true,
		"source.address": true, "source.port": true, "destination.address": true, "destination.port": true,
	}
	responseAttributes = map[string]bool{"response.code": true}
)

// requestAttributes fills the configured request attributes, keyed under the
// filter's name as Envoy does.
func (x *exchange) requestAttributes() map[string]*structpb.Struct {
	if len(x.pc.requestAttrs) == 0 {
		return nil
	}
	get := func(k string) string { v, _ := x.hs.get(k); return v }
	fields := map[string]*structpb.Value{}
	local, _ := x.r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	for _, a := range x.pc.requestAttrs {
		switch a {
		case "request.path":
			fields[a] = structpb.NewStringValue(get(":path"))
		case "request.url_path":
			fields[a] = structpb.NewStringValue(strings.SplitN(get(":path"), "?", 2)[0])
		case "request.host":
			fields[a] = structpb.NewStringValue(get(":authority"))
		case "request.scheme":
			fields[a] = structpb.NewStringValue("http")
		case "request.method":
			fields[a] = structpb.NewStringValue(get(":method"))
		case "request.protocol":
			fields[a] = structpb.NewStringValue(x.r.Proto)
		case "request.id":
			fields[a] = structpb.NewStringValue(get("x-request-id"))
		case "source.address":
			fields[a] = structpb.NewStringValue(x.r.RemoteAddr)
		case "source.port":
			fields[a] = portValue(x.r.RemoteAddr)
		case "destination.address":
			if local != nil {
				fields[a] = structpb.NewStringValue(local.String())
			}
		case "destination.port":
			if local != nil {
				fields[a] = portValue(local.String())
			}
		}
	}
	return map[string]*structpb.Struct{envoy.ExtProcFilterName: {Fields: fields}}
}

// Names of the Gateway API Inference Extension's subset hint.
const (
	subsetHintNamespace = "envoy.lb.subset_hint"
	subsetHintKey       = "x-gateway-destination-endpoint-subset"
)

// metadataContext carries the forwarded filter metadata: the subset hint,
// when the bootstrap forwards it and one is set for this request (request
// path only), and the envoy.lb namespace as it stands, when forwarded.
func (x *exchange) metadataContext(requestPath bool) *corev3.Metadata {
	md := map[string]*structpb.Struct{}
	if requestPath && x.pc.forwardSubsetHint && x.g.subsetHint != nil {
		if hint := x.g.subsetHint(x.r); hint != nil {
			list := make([]*structpb.Value, len(hint))
			for i, h := range hint {
				list[i] = structpb.NewStringValue(h)
			}
			md[subsetHintNamespace] = &structpb.Struct{Fields: map[string]*structpb.Value{subsetHintKey: structpb.NewListValue(&structpb.ListValue{Values: list})}}
		}
	}
	if x.pc.forwardLB {
		if lb := x.meta[envoy.LBMetadataNamespace]; len(lb.GetFields()) > 0 {
			md[envoy.LBMetadataNamespace] = proto.Clone(lb).(*structpb.Struct)
		}
	}
	if len(md) == 0 {
		return nil
	}
	return &corev3.Metadata{FilterMetadata: md}
}

func portValue(addr string) *structpb.Value {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return structpb.NewNumberValue(float64(n))
}
