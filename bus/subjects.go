package bus

// SeqHeader is the NATS header carrying the publisher's batch sequence
// number (decimal, starting at 0 for a fresh stream).
const SeqHeader = "Kvroute-Seq"

// EventsSubject is the subject a worker publishes its KV events on.
func EventsSubject(ns, worker string) string { return "kvroute." + ns + ".events." + worker }

// EventsWildcard matches every worker's events subject in namespace ns.
func EventsWildcard(ns string) string { return "kvroute." + ns + ".events.>" }

// LoadSubject returns the NATS subject a worker's load reports go to.
func LoadSubject(namespace, workerID string) string {
	return "kvroute." + namespace + ".load." + workerID
}

// LoadSubjectWildcard returns the subject that matches every worker's reports.
func LoadSubjectWildcard(namespace string) string {
	return "kvroute." + namespace + ".load.>"
}

// SyncSubject returns the NATS subject router replicas share lifecycle
// events on.
func SyncSubject(namespace string) string { return "kvroute." + namespace + ".router.sync" }

// ObservedSubject returns the NATS subject router replicas forward the
// observing ext_proc filter's reports on, when the report reached a
// replica that did not route the request.
func ObservedSubject(namespace string) string { return "kvroute." + namespace + ".router.observed" }

// WorkersPrefix returns the etcd key prefix under which a namespace's
// workers live.
func WorkersPrefix(namespace string) string {
	return "/kvroute/" + namespace + "/workers/"
}

// WorkerKey returns the etcd key of one worker's record.
func WorkerKey(namespace, id string) string {
	return WorkersPrefix(namespace) + id
}

// ResyncSubject is the NATS request subject on which a worker's event
// publisher (kvsim, kvbridge) takes resync requests: a router whose view of
// the worker is stale asks it to re-announce its cache (AllBlocksCleared,
// then what it holds) or to start its stream afresh.
func ResyncSubject(namespace, workerID string) string {
	return "kvroute." + namespace + ".resync." + workerID
}
