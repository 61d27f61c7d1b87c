package fleet

// Sink receives the fleet as a worker source learns it: every source in
// package discovery feeds one, and the router's fleet fans each change out
// to listeners of the same shape (the pool, the KV index, xDS). A source
// calls it from one goroutine at a time; Upsert may repeat a record that
// did not change.
type Sink interface {
	// Upsert adds a worker or replaces its record.
	Upsert(Worker)
	// Remove drops a worker: it left the source (a key deleted, a lease
	// lapsed, a line taken out of the file, a pod no longer Ready).
	Remove(id string)
}

// RestartSink is an optional Sink: a source that can tell a worker's new
// process from its old one under the same id (etcd: the record written
// again under a new lease while the old one still held it) says so, and
// the sink drops what it credited to the old process. Upsert follows.
type RestartSink interface {
	Restarted(id string)
}
