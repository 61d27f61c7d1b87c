// Package bus is kvroute's wire contract on NATS and etcd, in one place:
// the subjects and headers, the codecs of what travels on them, and the
// adapters that move it between the network and the pure packages.
//
//   - KV events: EventsSubject, SeqHeader and PublishEvents; the transports
//     SubscribeEvents (core NATS) and ConsumeEventStream (the durable
//     JetStream stream) deliver each batch with its worker and number to the
//     KV event core (kvevents), which sequences and applies them;
//   - load reports: LoadSubject, ParseLoadReport and LoadReports, which feeds
//     fleet.LoadReport values into a LoadSink (the router's scoring.Pool);
//   - replica sync: SyncSubject, ParseSyncEvent and Sync, which shares a
//     SyncPool's lifecycle events (fleet.SyncEvent) between router replicas;
//   - worker registration in etcd: WorkersPrefix and WorkerKey (the value is
//     fleet.Worker as JSON).
//
// kvindex and scoring stay free of NATS and etcd: they hold the data and
// the logic, this package holds the edges. bus does not import the
// scheduler either: LoadReports and Sync drive it through the small
// interfaces of pool.go (LoadSink, SyncPool and their metrics), which the
// scheduler's pool satisfies; the server wires the two.
package bus
