package server

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/bus"
)

// With several replicas behind one Envoy cluster, the observing ext_proc
// filter's report of a request's response headers may reach another
// replica than the one that routed the request (Envoy balances the two
// ext_proc streams of a request independently). A replica that cannot
// match a report publishes it on bus.ObservedSubject; every replica
// applies what it receives there to its own routing streams, and the one
// that routed the request takes it, within the grace its routing stream
// waits after its end (extproc.DefaultObserveGrace). Without NATS there
// are no peers to forward to.

// forwardObservation is extproc.ServerConfig.ForwardObservation: nil
// without NATS.
func (r *Server) forwardObservation() func([]byte) {
	if r.nc == nil {
		return nil
	}
	subject := bus.ObservedSubject(r.cfg.Namespace)
	return func(report []byte) {
		// Publish buffers and does not block; a report lost while NATS is
		// away costs that request's outcome, not its load.
		_ = r.nc.Publish(subject, report)
	}
}

// receiveObservations subscribes to the peers' forwarded reports.
func (r *Server) receiveObservations() error {
	if r.nc == nil {
		return nil
	}
	_, err := r.nc.Subscribe(bus.ObservedSubject(r.cfg.Namespace), func(m *nats.Msg) {
		r.server.ObservePeer(m.Data)
	})
	if err != nil {
		return fmt.Errorf("subscribe to forwarded observations: %w", err)
	}
	return nil
}
