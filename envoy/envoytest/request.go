package envoytest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

var requestMessages = bodyMessages{
	body: func(chunk []byte, eos bool) *extprocsvc.ProcessingRequest {
		return &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_RequestBody{
			RequestBody: &extprocsvc.HttpBody{Body: chunk, EndOfStream: eos}}}
	},
	trailers: func(t headerMap) *extprocsvc.ProcessingRequest {
		return &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocsvc.HttpTrailers{Trailers: t.proto()}}}
	},
}

// bufferedRequest runs the request path in BUFFERED (or NONE) mode: wait for
// the headers answer, then send the whole body and wait again; the router
// only starts after that.
func (x *exchange) bufferedRequest(hasBody bool) {
	var body []byte
	replaced := false
	if resp, stop := x.step(armedNow, phRequestHeaders); stop {
		return
	} else if resp != nil {
		cr := resp.GetRequestHeaders().GetResponse()
		if x.applyCommon(cr, &x.hs, true) {
			return
		}
		if cr.GetStatus() == extprocsvc.CommonResponse_CONTINUE_AND_REPLACE {
			body, replaced = mutateBody(cr.GetBodyMutation(), nil), true
		}
	}
	buffering := x.proc != nil && x.pc.mode.GetRequestBodyMode() == extprocv3.ProcessingMode_BUFFERED
	if !hasBody || replaced {
		x.forward(bodyReader(body), int64(len(body)), nil)
		return
	}
	if !buffering {
		x.forward(x.r.Body, x.r.ContentLength, x.r.Trailer)
		return
	}
	body, err := io.ReadAll(io.LimitReader(x.r.Body, x.g.cfg.bufferLimit+1))
	if err != nil {
		return // the client went away
	}
	if int64(len(body)) > x.g.cfg.bufferLimit {
		x.reply(http.StatusRequestEntityTooLarge, nil, []byte("Payload Too Large"))
		return
	}
	trailers := trailerMap(x.r.Trailer)
	sendTrailers := len(trailers) > 0 && x.pc.mode.GetRequestTrailerMode() == extprocv3.ProcessingMode_SEND
	if err := x.proc.send(requestMessages.body(body, !sendTrailers)); err != nil && x.procFail(err) {
		return
	}
	if resp, stop := x.step(armedNow, phRequestBody); stop {
		return
	} else if resp != nil {
		cr := resp.GetRequestBody().GetResponse()
		if x.applyCommon(cr, &x.hs, true) {
			return
		}
		body = mutateBody(cr.GetBodyMutation(), body)
	}
	if sendTrailers && x.proc != nil {
		if err := x.proc.send(requestMessages.trailers(trailers)); err != nil && x.procFail(err) {
			return
		}
		if resp, stop := x.step(armedNow, phRequestTrailers); stop {
			return
		} else if resp != nil {
			if err := applyHeaderMutation(resp.GetRequestTrailers().GetHeaderMutation(), &trailers, x.pc.rules); err != nil {
				x.procFail(err)
				return
			}
		}
	}
	x.forward(bodyReader(body), int64(len(body)), trailerHeader(trailers))
}

// duplexRequest runs the request path in FULL_DUPLEX_STREAMED mode: the body
// streams to the processor without waiting; the headers answer lets the
// router start, and the processor's streamed_response chunks become the
// upstream body in order.
func (x *exchange) duplexRequest(hasBody bool) {
	var snd *bodySender
	armed := armedNow
	if hasBody {
		snd = startBodySender(x.r.Body, x.r.ContentLength, func() http.Header { return x.r.Trailer }, x.proc,
			x.pc.mode.GetRequestTrailerMode() == extprocv3.ProcessingMode_SEND, requestMessages)
		// The processor may wait for the whole body before answering headers
		// (kvroute and the Inference Extension's picker do), so the timer
		// starts only once the body has been handed over.
		armed = snd.sent
	}
	if resp, stop := x.step(armed, phRequestHeaders); stop {
		return
	} else if resp != nil && x.applyCommon(resp.GetRequestHeaders().GetResponse(), &x.hs, true) {
		return
	}
	if !hasBody {
		x.forward(http.NoBody, 0, nil)
		return
	}
	// The processor may change the body, so its length is unknown (Envoy
	// drops content-length in this mode).
	x.hs.remove("content-length")
	pr, pw := io.Pipe()
	trailer := http.Header{}
	for k := range x.r.Trailer {
		trailer[k] = nil
	}
	call := x.startUpstream(pr, -1, trailer)
	if call == nil {
		pw.CloseWithError(errors.New("no upstream"))
		return
	}
	streamed, bodyDone := false, false
	for x.proc != nil && !bodyDone {
		resp, stop := x.step(armed, phRequestBody, phRequestTrailers)
		if stop {
			pw.CloseWithError(errors.New("request ended by ext_proc"))
			call.wait()
			return
		}
		if resp == nil {
			break
		}
		if resp.GetRequestTrailers() != nil {
			_, t, _ := snd.result()
			if err := applyHeaderMutation(resp.GetRequestTrailers().GetHeaderMutation(), &t, x.pc.rules); err != nil {
				pw.CloseWithError(err)
				call.wait()
				x.procFail(err)
				return
			}
			t.toHTTP(trailer)
			bodyDone = true
			break
		}
		sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			x.procFail(errSpurious) // duplex answers must carry streamed_response
			break
		}
		if len(sr.GetBody()) > 0 {
			streamed = true
			if _, err := pw.Write(sr.GetBody()); err != nil {
				break // the upstream request failed; finishUpstream reports it
			}
		}
		bodyDone = sr.GetEndOfStream()
	}
	if !bodyDone && x.proc == nil {
		// Processing stopped part way (failure_mode_allow, spurious message,
		// processor closed): forward the original body if none of the
		// processor's output went upstream yet.
		copyBody, t, err := snd.result()
		if streamed || err != nil {
			pw.CloseWithError(errors.New("ext_proc stopped mid-body"))
		} else {
			_, _ = pw.Write(copyBody)
			t.toHTTP(trailer)
		}
	}
	_ = pw.Close()
	x.finishUpstream(call)
}

// forward sends the request upstream and then runs the response path.
func (x *exchange) forward(body io.Reader, contentLength int64, trailer http.Header) {
	if call := x.startUpstream(body, contentLength, trailer); call != nil {
		x.finishUpstream(call)
	}
}

type upstreamCall struct {
	done     chan struct{}
	cancel   context.CancelFunc
	resp     *http.Response
	err      error
	timedOut bool
	// cluster and served are the cluster and the host of the last attempt.
	cluster *upstreamCluster
	served  string
}

func (c *upstreamCall) wait() {
	<-c.done
	if c.resp != nil {
		_ = c.resp.Body.Close()
	}
	c.cancel()
}

// startUpstream resolves the route (again, if the route cache was cleared),
// picks the host and starts the upstream request, retried as the route's
// retry_policy says. It returns nil after replying itself when there is no
// route, cluster or host.
func (x *exchange) startUpstream(body io.Reader, contentLength int64, trailer http.Header) *upstreamCall {
	if x.clearRoute {
		x.choice, x.routeOK = x.g.cfg.routes.match(x.hs)
	}
	if !x.routeOK {
		x.routerReply(http.StatusNotFound, "")
		return nil
	}
	rt := x.choice.route
	cluster, ok := x.g.cfg.clusters[x.choice.cluster]
	if !ok {
		x.routerReply(rt.notFound, "")
		return nil
	}
	// The load balancer reads the request's headers and dynamic metadata as
	// they are when the router starts; later attempts see the same.
	downstream, meta := x.hs.clone(), x.meta.snapshot()
	lookup := func(s hostSource) (string, bool) {
		if s.header != "" {
			return downstream.get(s.header)
		}
		return meta.get(s.ns, s.key)
	}
	st := &attempts{policy: rt.retry}
	endpoint, ok := cluster.pickAttempt(st, lookup)
	if !ok {
		x.routerReply(http.StatusServiceUnavailable, "no healthy upstream")
		return nil
	}
	hs := x.hs.clone()
	for _, h := range x.g.cfg.routes.headersToRemove(x.choice) {
		hs.remove(strings.ToLower(h))
	}
	method, _ := hs.get(":method")
	path, _ := hs.get(":path")
	authority, _ := hs.get(":authority")
	ctx, cancel := context.WithCancel(x.ctx)
	if rt.timeout > 0 {
		// The route timeout spans every attempt, as in Envoy.
		ctx, cancel = context.WithTimeout(x.ctx, rt.timeout)
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	if _, err := url.ParseRequestURI("http://" + endpoint + path); err != nil {
		cancel()
		x.routerReply(http.StatusBadRequest, "")
		return nil
	}
	// While a retry is possible the router keeps the body to send it again.
	var replay *replayBody
	if rt.retry != nil && rt.retry.numRetries > 0 && contentLength != 0 {
		replay = newReplayBody(body, x.g.cfg.bufferLimit)
	}
	call := &upstreamCall{done: make(chan struct{}), cancel: cancel, cluster: cluster}
	rtp := cluster.roundTripper()
	go func() {
		defer close(call.done)
		for attempt := 0; ; attempt++ {
			attemptBody := body
			var cur *bodyCursor
			if replay != nil {
				cur = replay.cursor()
				attemptBody = cur
			}
			req, err := http.NewRequestWithContext(ctx, method, "http://"+endpoint+path, attemptBody)
			if err != nil {
				call.err = err
				break
			}
			req.Host = authority
			req.ContentLength = contentLength
			if contentLength == 0 {
				req.Body = http.NoBody
			}
			for _, e := range hs {
				if strings.HasPrefix(e.key, ":") || hopByHop[e.key] || e.key == "host" || e.key == "content-length" {
					continue
				}
				req.Header[http.CanonicalHeaderKey(e.key)] = append(req.Header[http.CanonicalHeaderKey(e.key)], e.value)
			}
			req.Trailer = trailer
			call.served = endpoint
			call.resp, call.err = rtp.RoundTrip(req)
			if call.err == nil {
				return
			}
			if cur != nil {
				_ = cur.Close()
			}
			if ctx.Err() != nil || attempt >= rt.retry.maxRetries() || !rt.retry.retriable(call.err) ||
				replay != nil && replay.overflowed() || !retryBackoff(ctx) {
				break
			}
			next, ok := cluster.pickAttempt(st, lookup)
			if !ok {
				break
			}
			endpoint = next
		}
		call.timedOut = errors.Is(ctx.Err(), context.DeadlineExceeded)
		if pr, ok := body.(*io.PipeReader); ok {
			pr.CloseWithError(call.err) // unblock the body writer
		}
	}()
	return call
}

// finishUpstream waits for the upstream response head and runs the
// response path, or replies with Envoy's local reply for the failure.
func (x *exchange) finishUpstream(call *upstreamCall) {
	<-call.done
	defer call.wait()
	if o := call.cluster.override; o != nil && o.selectedKey != "" && call.served != "" {
		// override_host writes the host it picked for the last attempt.
		x.meta.set(o.selectedNS, o.selectedKey, call.served)
	}
	if call.err != nil {
		if x.ctx.Err() != nil {
			return
		}
		if call.timedOut {
			x.routerReply(http.StatusGatewayTimeout, "upstream request timeout")
			return
		}
		x.routerReply(http.StatusServiceUnavailable,
			"upstream connect error or disconnect/reset before headers. reset reason: connection failure")
		return
	}
	x.responsePhase(call.resp)
}

// routerReply is a local reply from the router. Unlike the ext_proc
// filter's own replies it passes through the response path, so the
// processor sees its headers and body as Envoy would send them.
func (x *exchange) routerReply(code int, body string) {
	resp := &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody}
	if body != "" {
		resp.Header.Set("Content-Type", "text/plain")
		resp.Body = io.NopCloser(strings.NewReader(body))
	}
	resp.ContentLength = int64(len(body))
	x.responsePhase(resp)
}

func mutateBody(bm *extprocsvc.BodyMutation, cur []byte) []byte {
	switch m := bm.GetMutation().(type) {
	case *extprocsvc.BodyMutation_Body:
		return m.Body
	case *extprocsvc.BodyMutation_ClearBody:
		if m.ClearBody {
			return nil
		}
	}
	return cur
}

func bodyReader(b []byte) io.Reader {
	if len(b) == 0 {
		return http.NoBody
	}
	return bytes.NewReader(b)
}

func trailerHeader(t headerMap) http.Header {
	if len(t) == 0 {
		return nil
	}
	h := http.Header{}
	t.toHTTP(h)
	return h
}
