package bus

import "github.com/kvroute/kvroute/fleet"

// What the NATS adapters drive, declared here so that bus depends on the
// shared nouns (fleet) and not on the scheduler: the router's scoring.Pool
// and its Metrics satisfy these, and server wires them in.

// LoadSink takes each worker's load report (LoadReports); an error means
// the report named an unknown worker or could not be applied.
type LoadSink interface {
	SetLoadReport(worker string, r fleet.LoadReport) error
}

// LoadMetrics counts what LoadReports refuses.
type LoadMetrics interface {
	// LoadReportRejected counts a report that was malformed or named an
	// unknown worker.
	LoadReportRejected()
}

// SyncPool is the pool replica sync shares (Sync): it hands its local
// lifecycle events to a sink, applies peers' events and drops a silent
// peer's in-flight load, returning how many requests that was.
type SyncPool interface {
	SetSink(func(fleet.SyncEvent))
	Apply(fleet.SyncEvent) error
	DropPeer(router string) int
}

// SyncMetrics counts replica sync's refusals, drops and expiries.
type SyncMetrics interface {
	// SyncRejected counts a peer message that could not be decoded or
	// applied.
	SyncRejected()
	// SyncDropped counts a local event not published because the outgoing
	// buffer was full.
	SyncDropped()
	// PeerExpired counts a peer whose load was dropped because its
	// heartbeats stopped.
	PeerExpired()
}

// nopMetrics stands in when a constructor is given no metrics.
type nopMetrics struct{}

func (nopMetrics) LoadReportRejected() {}
func (nopMetrics) SyncRejected()       {}
func (nopMetrics) SyncDropped()        {}
func (nopMetrics) PeerExpired()        {}
