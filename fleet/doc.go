// Package fleet holds the nouns every part of kvroute shares about the
// workers it routes to: the registration record (Worker) and its checks,
// the load a worker reports (LoadReport), the lifecycle events router
// replicas exchange (SyncEvent), and the one Sink every worker source feeds.
//
// It is a leaf: data, validation and interfaces, no I/O, and no other
// kvroute package, so a worker source, a sidecar or a transport can name a
// worker without importing the scheduler (package scoring).
package fleet
