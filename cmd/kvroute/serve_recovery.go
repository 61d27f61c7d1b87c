package main

import (
	"flag"
	"os"
	"path/filepath"

	"github.com/kvroute/kvroute/server"
)

// registerRecoveryFlags adds the failure-recovery flags of `kvroute serve`:
// passive health, replica heartbeats, lease-flap grace, resyncs and warm
// starts.
func registerRecoveryFlags(fs *flag.FlagSet, c *server.Config) {
	o, rc := &c.Scoring, &c.Recovery
	fs.IntVar(&o.EjectAfter, "eject-after", o.EjectAfter, "passive health: eject a worker after this many consecutive failed requests (5xx, connect failure, reset before the response); -1 turns it off")
	fs.DurationVar(&o.EjectBackoff, "eject-backoff", o.EjectBackoff, "passive health: first ejection's length, doubled on each further ejection without a success")
	fs.DurationVar(&o.EjectBackoffMax, "eject-backoff-max", o.EjectBackoffMax, "passive health: longest ejection")
	fs.DurationVar(&rc.SyncHeartbeat, "sync-heartbeat", rc.SyncHeartbeat, "replica sync heartbeat period; a peer silent for 3 periods has its in-flight load dropped")
	fs.DurationVar(&rc.LeaseFlapGrace, "lease-flap-grace", rc.LeaseFlapGrace, "keep a removed worker's index entries this long, so a worker whose etcd lease lapsed and came back (same record) keeps its blocks; 0 drops them at once (etcd discovery only: a workers file or InferencePool removal purges at once)")
	fs.DurationVar(&rc.ResyncInterval, "resync-interval", rc.ResyncInterval, "ask a stale worker's publisher to resync (NATS request) at most this often while it stays stale; 0 turns resync requests off")
	fs.StringVar(&rc.WarmFrom, "warm-from", "", "peer replica `url` (http://host:port of its admin listener, --admin-listen; the --admin-token-file token is sent): load its KV index snapshot before turning ready; empty starts cold")
	fs.DurationVar(&rc.WarmTimeout, "warm-timeout", rc.WarmTimeout, "give up a --warm-from start after this long and start cold; also bounds a --durable-events recovery (past it the router turns ready behind the stream)")
	fs.BoolVar(&rc.DurableEvents, "durable-events", false, "keep KV events in a JetStream stream (kvroute-<namespace>-events, created by the router; publishers are unchanged) and index snapshots in a NATS object store bucket (kvroute-<namespace>-index); a starting router loads the newest snapshot and replays the stream's tail before turning ready. Needs JetStream on the NATS server (the embedded one enables it); cannot be combined with --warm-from")
	fs.DurationVar(&rc.EventsMaxAge, "events-max-age", rc.EventsMaxAge, "--durable-events: discard stream messages older than this (they must outlive --snapshot-interval, else a restart finds them gone and resyncs every worker)")
	fs.Int64Var(&rc.EventsMaxBytes, "events-max-bytes", rc.EventsMaxBytes, "--durable-events: the stream's size limit in bytes, oldest messages discarded first; 0: no limit")
	fs.DurationVar(&rc.SnapshotInterval, "snapshot-interval", rc.SnapshotInterval, "--durable-events: write the index to the object store this often (skipped when no event arrived since), and once more on a clean shutdown; 0: only at shutdown")
	fs.IntVar(&rc.JetStreamReplicas, "jetstream-replicas", rc.JetStreamReplicas, "--durable-events: replicas of the stream and the snapshot bucket in a JetStream cluster")
	fs.StringVar(&rc.StateDir, "state-dir", "", "keep the last fleet discovery gave in `dir`/fleet-<namespace>.json (written atomically after each change), so a router restarted while etcd or the Kubernetes API server is away still routes to its workers; mount a volume that outlives the container there (default <tmp>/kvroute-state; off: keep none)")
	fs.StringVar(&rc.JetStreamDir, "jetstream-dir", "", "--durable-events with the embedded NATS server (no --nats-url): its JetStream store `dir`, locked against a second process (default <tmp>/kvroute-jetstream-<embedded NATS port>; a random port gets a fresh directory)")
}

// stateDir resolves --state-dir: empty is the default under the
// temporary directory, "off" keeps no state.
func stateDir(flagValue string) string {
	switch flagValue {
	case "":
		return filepath.Join(os.TempDir(), "kvroute-state")
	case "off":
		return ""
	}
	return flagValue
}
