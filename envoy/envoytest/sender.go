package envoytest

import (
	"errors"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"

	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// chunkSize bounds one body message, like one read from Envoy's codec.
const chunkSize = 32 << 10

// bodySender streams a body to the processor without waiting for answers,
// as Envoy does in FULL_DUPLEX_STREAMED mode, and keeps a copy so the body
// can still be forwarded unprocessed if the processor drops out.
type bodySender struct {
	sent chan struct{} // closed once the last message (eos body or trailers) went out or reading failed
	done chan struct{} // closed when the body has been read to its end

	mu       sync.Mutex
	copy     []byte
	readErr  error
	trailers headerMap
}

// bodyMessages builds the ProcessingRequests of one direction.
type bodyMessages struct {
	body     func(chunk []byte, eos bool) *extprocsvc.ProcessingRequest
	trailers func(t headerMap) *extprocsvc.ProcessingRequest
}

// startBodySender reads body in its own goroutine. contentLength (-1 when
// unknown) marks the last chunk end_of_stream as Envoy's codec does; else an
// empty end_of_stream chunk follows the data. Trailers go out as a trailers
// message when sendTrailers, replacing the end_of_stream chunk.
func startBodySender(body io.Reader, contentLength int64, trailer func() http.Header, p *procStream,
	sendTrailers bool, msgs bodyMessages) *bodySender {
	s := &bodySender{sent: make(chan struct{}), done: make(chan struct{})}
	go s.run(body, contentLength, trailer, p, sendTrailers, msgs)
	return s
}

func (s *bodySender) run(body io.Reader, contentLength int64, trailer func() http.Header, p *procStream,
	sendTrailers bool, msgs bodyMessages) {
	defer close(s.done)
	sentClosed := false
	markSent := func() {
		if !sentClosed {
			close(s.sent)
			sentClosed = true
		}
	}
	defer markSent()
	send := func(m *extprocsvc.ProcessingRequest) {
		if p == nil {
			return
		}
		if err := p.send(m); err != nil {
			p = nil // the main flow sees the failure on its side
		}
	}
	buf := make([]byte, chunkSize)
	var total int64
	eosSent := false
	for {
		n, err := body.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			total += int64(n)
			s.mu.Lock()
			s.copy = append(s.copy, chunk...)
			s.mu.Unlock()
			eos := contentLength >= 0 && total >= contentLength
			send(msgs.body(chunk, eos))
			if eos {
				eosSent = true
				markSent()
			}
		}
		if errors.Is(err, io.EOF) {
			t := trailerMap(trailer())
			s.mu.Lock()
			s.trailers = t
			s.mu.Unlock()
			switch {
			case len(t) > 0 && sendTrailers:
				send(msgs.trailers(t))
			case !eosSent:
				send(msgs.body(nil, true))
			}
			return
		}
		if err != nil {
			s.mu.Lock()
			s.readErr = err
			s.mu.Unlock()
			return
		}
	}
}

// result waits for the end of the body and returns the copy, trailers and
// the read error, if any.
func (s *bodySender) result() ([]byte, headerMap, error) {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.copy, s.trailers, s.readErr
}

// trailerMap turns Go's trailers into a header map, skipping the declared
// but never sent ones.
func trailerMap(h http.Header) headerMap {
	keys := make([]string, 0, len(h))
	for k, v := range h {
		if len(v) > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out headerMap
	for _, k := range keys {
		for _, v := range h[k] {
			out.add(strings.ToLower(k), v)
		}
	}
	return out
}

// toHTTP writes a header map's regular entries into h.
func (h headerMap) toHTTP(dst http.Header) {
	for _, e := range h {
		if !strings.HasPrefix(e.key, ":") && !hopByHop[e.key] {
			dst.Add(e.key, e.value)
		}
	}
}
