package server

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// RecoveryConfig is how a router recovers from faults around it: dead
// peers, lease flaps, gaps in a worker's events and its own restarts.
type RecoveryConfig struct {
	// SyncHeartbeat is the replica-sync heartbeat period; a peer silent for
	// three of its periods has its load dropped (default 1 s).
	SyncHeartbeat time.Duration
	// LeaseFlapGrace keeps a removed worker's index entries this long, so
	// that a worker whose etcd lease lapsed and was re-granted (the same
	// record) keeps its blocks; 0 drops them at once (default 30 s).
	LeaseFlapGrace time.Duration
	// ResyncInterval is how often a stale worker is asked to resync over
	// NATS while it stays stale; 0 turns resync requests off (default 5 s).
	ResyncInterval time.Duration
	// WarmFrom is a peer replica's HTTP base URL: before it turns ready,
	// the router loads that peer's index snapshot (GET
	// /debug/index/snapshot). Empty: start cold.
	WarmFrom string
	// WarmTimeout bounds the warm start; past it the router starts cold
	// (default 60 s); it also bounds a --durable-events recovery.
	WarmTimeout time.Duration

	// DurableEvents reads KV events from a JetStream stream (created with
	// the limits below) instead of the core subscription, writes periodic
	// index snapshots to a NATS object store, and recovers from the newest
	// snapshot plus the stream's tail before turning ready.
	DurableEvents bool
	// EventsMaxAge and EventsMaxBytes bound the stream (defaults 1 h, 1 GiB;
	// 0 bytes: unlimited).
	EventsMaxAge   time.Duration
	EventsMaxBytes int64
	// SnapshotInterval is how often the index is written to the object
	// store (default 5 m; one more on a clean shutdown). 0: only at
	// shutdown.
	SnapshotInterval time.Duration
	// JetStreamReplicas is the stream's and bucket's replica count in a
	// JetStream cluster (default 1).
	JetStreamReplicas int
	// JetStreamDir is the embedded NATS server's JetStream store directory
	// (used when no NATS URL is given; default <tmp>/kvroute-jetstream-<port>).
	JetStreamDir string

	// StateDir holds the fleet state file, fleet-<namespace>.json: the
	// last fleet discovery gave, rewritten atomically after each change,
	// read at start so that a router restarted while etcd or the
	// Kubernetes API server is away still knows its workers. Empty: no
	// state kept (kvroute serve defaults to <tmp>/kvroute-state).
	StateDir string
}

// DefaultRecoveryConfig returns the documented defaults.
func DefaultRecoveryConfig() RecoveryConfig {
	return RecoveryConfig{SyncHeartbeat: time.Second, LeaseFlapGrace: 30 * time.Second,
		ResyncInterval: 5 * time.Second, WarmTimeout: 60 * time.Second,
		EventsMaxAge: time.Hour, EventsMaxBytes: 1 << 30, SnapshotInterval: 5 * time.Minute, JetStreamReplicas: 1}
}

// Validate reports the first setting that cannot work.
func (c RecoveryConfig) Validate() error {
	if c.SyncHeartbeat < 0 || c.LeaseFlapGrace < 0 || c.ResyncInterval < 0 || c.WarmTimeout < 0 ||
		c.EventsMaxAge < 0 || c.SnapshotInterval < 0 {
		return errors.New("recovery durations must not be negative")
	}
	if c.DurableEvents && c.WarmFrom != "" {
		return errors.New("--durable-events and --warm-from both recover the index at start: give one (durable events recover from the stream and the object store, which every replica shares)")
	}
	if c.EventsMaxBytes < 0 || c.JetStreamReplicas < 0 {
		return errors.New("events max bytes and jetstream replicas must not be negative")
	}
	if c.WarmFrom != "" {
		u, err := url.Parse(c.WarmFrom)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("warm-from %q: want an http(s)://host:port URL of a peer replica", c.WarmFrom)
		}
	}
	return nil
}
