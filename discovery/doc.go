// Package discovery says where the fleet's workers come from. A Source
// mirrors one place that lists workers into a fleet.Sink: etcd leases
// (discovery/etcd), a static workers file (discovery/file) or a Gateway API
// Inference Extension InferencePool (discovery/kubepool). The router runs
// exactly one Source, through one start loop (server/discovery.go).
//
// This package holds what every source shares: the worker record and its
// edge checks (ValidateRecord, AddressPolicy; a record is a
// fleet.Worker, whose JSON layout is the contract between workers and
// the router, docs/architecture.md §3.1), the fleet.Sink and Observer a source
// reports to, the reachability probe, and WaitSynced.
//
// # Writing a new source
//
// A new source is a package under discovery/ with a Config, a New(Config)
// that checks the configuration and fails on what cannot work, and a type
// that implements Source:
//
//   - Run mirrors the workers into the fleet.Sink until the context ends, keeps
//     the last known workers while its backend is away, and returns the
//     context's error. It validates every record at the edge
//     (ValidateRecordWith) and refuses a bad one through
//     Observer.BadRecord after logging it, keeping the worker's last good
//     record.
//   - Synced is closed once the fleet.Sink holds the first full view.
//   - FlapGrace is zero unless a removal may be undone by the same worker
//     coming back (etcd leases).
//   - A source with a backend that can go away reports it through
//     Observer.Health; Reachability and Probe do the bookkeeping.
//
// Then add one row to the server's source table (server/discovery.go) with
// its flag-derived configuration, and run the shared contract test
// (internal/testenv/sourcetest) against a real backend.
package discovery
