package extproc

import (
	"errors"
	"sync"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
)

// Names of the gRPC metadata with which a routing ext_proc filter tells
// kvroute that the response reaches it through a second filter in
// observability mode (the bootstraps' default response path): Envoy then
// waits on kvroute once per request, for the routing decision.
const (
	ObservedMetadataKey   = "x-kvroute-response"
	ObservedMetadataValue = "observed"
)

// DefaultObserveGrace is ServerConfig.ObserveGrace's default.
const DefaultObserveGrace = 250 * time.Millisecond

// ObserveMetrics is what a Metrics may also implement to count the
// observing filter's reports: matched to a routing stream of this
// process, or not (a request another replica routed, one Envoy let
// through without kvroute's answer, one whose request id another request
// holds, or one whose routing stream has ended).
type ObserveMetrics interface {
	Observation(matched bool)
}

// observers matches the observing filter's reports to the routing streams
// they are about, by request id. A routing stream registers once it has
// routed; it leaves when its request is over (its end, after the report or
// the grace).
//
// Envoy closes the routing stream when the response ends and sends the
// observing filter's message when the response headers pass, on another
// stream: for a short answer the close often comes first. The routing
// stream's end then waits up to grace for the report before it frees the
// load, so that a 5xx still counts against the worker and Envoy's own
// replies against nobody. Without a report within grace (the report went
// to another replica, or the data plane sends none) the end frees the
// load as a normal end.
type observers struct {
	grace time.Duration
	mu    sync.Mutex
	byID  map[string]*observedStream
}

// observedStream is one registered routing stream. mu serializes every
// call into st once it is registered: its own goroutine (Step, Close) and
// the observing stream's (Observe) may both reach it.
type observedStream struct {
	mu     sync.Mutex
	st     *Stream
	id     string
	ended  bool // the routing stream ended, waiting for the report
	endErr error
	timer  *time.Timer
	closed bool // st.Close was called
}

func newObservers(grace time.Duration) *observers {
	return &observers{grace: grace, byID: map[string]*observedStream{}}
}

// register files st under id. It returns nil when id is empty or already
// taken (ids repeat only when clients set their own): that stream then
// ends on its own, without the report.
func (o *observers) register(id string, st *Stream) *observedStream {
	if id == "" {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, taken := o.byID[id]; taken {
		return nil
	}
	e := &observedStream{st: st, id: id}
	o.byID[id] = e
	return e
}

func (o *observers) lookup(id string) *observedStream {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byID[id]
}

func (o *observers) remove(e *observedStream) {
	o.mu.Lock()
	if o.byID[e.id] == e {
		delete(o.byID, e.id)
	}
	o.mu.Unlock()
}

// pending is how many routing streams are registered, for tests.
func (o *observers) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byID)
}

// end is the routing stream's end (err as for Stream.Close). A stream that
// already has its report, or that failed, closes now; a routed stream that
// Envoy closed before the report waits up to grace for it.
func (o *observers) end(e *observedStream, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.st.phase != phRouted || !endedByEnvoy(err) || o.grace <= 0 {
		o.closeLocked(e, err)
		return
	}
	e.ended, e.endErr = true, err
	e.timer = time.AfterFunc(o.grace, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		o.closeLocked(e, e.endErr)
	})
}

func (o *observers) closeLocked(e *observedStream, err error) {
	if e.closed {
		return
	}
	e.closed = true
	if e.timer != nil {
		e.timer.Stop()
	}
	e.st.Close(err)
	o.remove(e)
}

// observe applies one message of an observing stream. It reports whether
// a routing stream took it.
func (o *observers) observe(m *pb.ProcessingRequest) bool {
	id := m.GetAttributes()[AttributesNamespace].GetFields()[RequestIDAttribute].GetStringValue()
	e := o.lookup(id)
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	ok := e.st.Observe(m)
	if e.ended {
		o.closeLocked(e, e.endErr)
	}
	return ok
}

// maxObservationBytes bounds a forwarded report: response headers,
// attributes and metadata, far below this in practice.
const maxObservationBytes = 256 << 10

// encodeObservation keeps of an observing filter's message what a peer
// needs to apply it (the response headers, the attributes with the
// request id and code details, the metadata with the endpoint that
// served) and encodes it for ObservePeer.
func encodeObservation(m *pb.ProcessingRequest) ([]byte, error) {
	return proto.Marshal(&pb.ProcessingRequest{
		Request:           &pb.ProcessingRequest_ResponseHeaders{ResponseHeaders: m.GetResponseHeaders()},
		Attributes:        m.GetAttributes(),
		MetadataContext:   m.GetMetadataContext(),
		ObservabilityMode: true,
	})
}

// decodeObservation reads a report encodeObservation wrote; anything else
// (not protobuf, too large, not an observed response-headers message) is
// an error.
func decodeObservation(b []byte) (*pb.ProcessingRequest, error) {
	if len(b) > maxObservationBytes {
		return nil, errors.New("extproc: forwarded observation too large")
	}
	m := &pb.ProcessingRequest{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, err
	}
	if m.GetResponseHeaders() == nil || !m.GetObservabilityMode() {
		return nil, errors.New("extproc: forwarded observation is not an observed response-headers message")
	}
	return m, nil
}

// ObservePeer applies an observing filter's report that another replica
// received and forwarded (ServerConfig.ForwardObservation) to the routing
// stream of this server it is about, if any. It reports whether one took
// it; a report that is not for this server, or that does not decode, is
// dropped.
func (s *Server) ObservePeer(report []byte) bool {
	m, err := decodeObservation(report)
	if err != nil {
		return false
	}
	matched := s.observed.observe(m)
	if matched {
		if om, ok := s.metrics.(ObserveMetrics); ok {
			om.Observation(true)
		}
	}
	return matched
}
