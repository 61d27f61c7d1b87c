package envoytest

import (
	"errors"
	"github.com/kvroute/kvroute/envoy"
	"io"
	"net/http"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

var responseMessages = bodyMessages{
	body: func(chunk []byte, eos bool) *extprocsvc.ProcessingRequest {
		return &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocsvc.HttpBody{Body: chunk, EndOfStream: eos}}}
	},
	trailers: func(t headerMap) *extprocsvc.ProcessingRequest {
		return &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocsvc.HttpTrailers{Trailers: t.proto()}}}
	},
}

// responsePhase sends the response back to the client, passing its headers,
// body and trailers through the processor as the processing mode asks.
func (x *exchange) responsePhase(resp *http.Response) {
	mode := x.pc.mode
	hs := headerMap{{":status", strconv.Itoa(resp.StatusCode)}}
	hs.fromHTTP(resp.Header)
	hasBody := resp.Body != nil && resp.Body != http.NoBody && resp.ContentLength != 0
	bodyMode := mode.GetResponseBodyMode()
	if x.proc != nil && bodyMode != extprocv3.ProcessingMode_NONE {
		hs.remove("content-length") // the processor may change the body
	}
	trailerSend := mode.GetResponseTrailerMode() == extprocv3.ProcessingMode_SEND
	if x.proc != nil && mode.GetResponseHeaderMode() != extprocv3.ProcessingMode_SKIP {
		err := x.proc.send(&extprocsvc.ProcessingRequest{
			Request: &extprocsvc.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocsvc.HttpHeaders{
				Headers: hs.proto(), EndOfStream: !hasBody,
			}},
			Attributes:      x.responseAttributes(resp.StatusCode),
			MetadataContext: x.metadataContext(false),
		})
		if err != nil && x.procFail(err) {
			return
		}
	}
	var snd *bodySender
	if x.proc != nil && hasBody && bodyMode == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		snd = startBodySender(resp.Body, resp.ContentLength, func() http.Header { return resp.Trailer }, x.proc,
			trailerSend, responseMessages)
	}
	if x.proc != nil && mode.GetResponseHeaderMode() != extprocv3.ProcessingMode_SKIP {
		r, stop := x.step(armedNow, phResponseHeaders)
		if stop {
			return
		}
		if r != nil && x.applyCommon(r.GetResponseHeaders().GetResponse(), &hs, false) {
			return
		}
	}
	status, _ := hs.get(":status")
	code, err := strconv.Atoi(status)
	if err != nil || code < 200 || code > 999 {
		x.procFail(errors.Join(errMutation, errors.New("invalid :status "+status)))
		return
	}
	hs.toHTTP(x.w.Header())
	x.wroteHead = true
	x.w.WriteHeader(code)
	x.flush()
	if !hasBody {
		return
	}
	switch {
	case snd != nil:
		x.duplexResponseBody(snd)
	case x.proc != nil && bodyMode == extprocv3.ProcessingMode_STREAMED:
		x.streamedResponseBody(resp, trailerSend)
	default:
		x.copyBody(resp.Body)
		x.writeTrailers(trailerMap(resp.Trailer))
	}
}

func (x *exchange) flush() { _ = http.NewResponseController(x.w).Flush() }

// copyBody streams the body to the client, flushing every chunk so that
// server-sent events arrive as they are produced.
func (x *exchange) copyBody(body io.Reader) {
	buf := make([]byte, chunkSize)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := x.w.Write(buf[:n]); werr != nil {
				return
			}
			x.flush()
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				panic(http.ErrAbortHandler) // upstream reset: reset the client's stream too
			}
			return
		}
	}
}

// streamedResponseBody sends every chunk to the processor and forwards the
// processor's version of it, in order (STREAMED mode).
func (x *exchange) streamedResponseBody(resp *http.Response, trailerSend bool) {
	buf := make([]byte, chunkSize)
	var total int64
	eosSent := false
	exchangeChunk := func(chunk []byte, eos bool) []byte {
		if x.proc == nil {
			return chunk
		}
		if err := x.proc.send(responseMessages.body(chunk, eos)); err != nil && x.procFail(err) {
			panic(http.ErrAbortHandler)
		}
		r, stop := x.step(armedNow, phResponseBody)
		if stop {
			panic(http.ErrAbortHandler) // the head is out; nothing else can be sent
		}
		if r == nil {
			return chunk
		}
		return mutateBody(r.GetResponseBody().GetResponse().GetBodyMutation(), chunk)
	}
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			total += int64(n)
			eos := resp.ContentLength >= 0 && total >= resp.ContentLength
			eosSent = eosSent || eos
			out := exchangeChunk(append([]byte(nil), buf[:n]...), eos)
			if _, werr := x.w.Write(out); werr != nil {
				return
			}
			x.flush()
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			panic(http.ErrAbortHandler)
		}
	}
	trailers := trailerMap(resp.Trailer)
	if len(trailers) > 0 && trailerSend && x.proc != nil {
		if err := x.proc.send(responseMessages.trailers(trailers)); err != nil && x.procFail(err) {
			panic(http.ErrAbortHandler)
		}
		r, stop := x.step(armedNow, phResponseTrailers)
		if stop {
			panic(http.ErrAbortHandler)
		}
		if r != nil {
			if err := applyHeaderMutation(r.GetResponseTrailers().GetHeaderMutation(), &trailers, x.pc.rules); err != nil {
				x.procFail(err)
				panic(http.ErrAbortHandler)
			}
		}
	} else if !eosSent {
		if out := exchangeChunk(nil, true); len(out) > 0 {
			_, _ = x.w.Write(out)
		}
	}
	x.writeTrailers(trailers)
}

// duplexResponseBody forwards the processor's streamed_response chunks as
// they arrive (FULL_DUPLEX_STREAMED), then its trailers.
func (x *exchange) duplexResponseBody(snd *bodySender) {
	streamed := false
	for x.proc != nil {
		r, stop := x.step(snd.sent, phResponseBody, phResponseTrailers)
		if stop {
			panic(http.ErrAbortHandler)
		}
		if r == nil {
			break
		}
		if rt := r.GetResponseTrailers(); rt != nil {
			_, t, _ := snd.result()
			if err := applyHeaderMutation(rt.GetHeaderMutation(), &t, x.pc.rules); err != nil {
				x.procFail(err)
				panic(http.ErrAbortHandler)
			}
			x.writeTrailers(t)
			return
		}
		sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			x.procFail(errSpurious)
			break
		}
		if len(sr.GetBody()) > 0 {
			streamed = true
			if _, err := x.w.Write(sr.GetBody()); err != nil {
				return
			}
			x.flush()
		}
		if sr.GetEndOfStream() {
			return
		}
	}
	// Processing stopped part way: forward the upstream's own bytes if the
	// client has seen none of the processor's.
	body, t, err := snd.result()
	if streamed || err != nil {
		panic(http.ErrAbortHandler)
	}
	_, _ = x.w.Write(body)
	x.writeTrailers(t)
}

func (x *exchange) writeTrailers(t headerMap) {
	for _, e := range t {
		x.w.Header().Add(http.TrailerPrefix+e.key, e.value)
	}
}

func (x *exchange) responseAttributes(code int) map[string]*structpb.Struct {
	if len(x.pc.responseAttrs) == 0 {
		return nil
	}
	fields := map[string]*structpb.Value{}
	for _, a := range x.pc.responseAttrs {
		if a == "response.code" {
			fields[a] = structpb.NewNumberValue(float64(code))
		}
	}
	return map[string]*structpb.Struct{envoy.ExtProcFilterName: {Fields: fields}}
}
