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
	// (default 60 s).
	WarmTimeout time.Duration
}

// DefaultRecoveryConfig returns the documented defaults.
func DefaultRecoveryConfig() RecoveryConfig {
	return RecoveryConfig{SyncHeartbeat: time.Second, LeaseFlapGrace: 30 * time.Second,
		ResyncInterval: 5 * time.Second, WarmTimeout: 60 * time.Second}
}

// Validate reports the first setting that cannot work.
func (c RecoveryConfig) Validate() error {
	if c.SyncHeartbeat < 0 || c.LeaseFlapGrace < 0 || c.ResyncInterval < 0 || c.WarmTimeout < 0 {
		return errors.New("recovery durations must not be negative")
	}
	if c.WarmFrom != "" {
		u, err := url.Parse(c.WarmFrom)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("warm-from %q: want an http(s)://host:port URL of a peer replica", c.WarmFrom)
		}
	}
	return nil
}
