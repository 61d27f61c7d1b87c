package kvevents

import "github.com/kvroute/kvroute/kvindex"

// BatchOutcome says what the core did with one delivered batch.
type BatchOutcome string

// Batch outcomes reported to Metrics.
const (
	BatchApplied       BatchOutcome = "applied"
	BatchDecodeError   BatchOutcome = "decode_error"
	BatchUnknownWorker BatchOutcome = "unknown_worker"
	BatchDuplicate     BatchOutcome = "duplicate"
	BatchBadSubject    BatchOutcome = "bad_subject" // the transport could not name the worker
)

// SeqEvent is a notable change in a worker's sequence numbers.
type SeqEvent string

// Sequence events reported to Metrics.
const (
	SeqGap     SeqEvent = "gap"     // numbers skipped: batches were lost
	SeqRestart SeqEvent = "restart" // numbers went back, but not to 0
	SeqFresh   SeqEvent = "fresh"   // 0 after a known stream, or a transport's reset: the stream started over
	SeqMissing SeqEvent = "missing" // the batch carried no sequence number
	SeqJoin    SeqEvent = "join"    // first batch seen from a worker did not have sequence 0
)

// Metrics receives the core's counters; the binary wires it to Prometheus.
// Implementations must be safe for concurrent use.
type Metrics interface {
	// Batch counts one delivered batch by outcome.
	Batch(worker string, outcome BatchOutcome)
	// Applied reports what Apply did with one batch.
	Applied(worker string, s kvindex.ApplyStats)
	// Sequence counts a gap, restart, fresh start, join or missing number.
	Sequence(worker string, ev SeqEvent)
}

// NopMetrics discards everything.
type NopMetrics struct{}

var _ Metrics = NopMetrics{}

// Batch does nothing.
func (NopMetrics) Batch(string, BatchOutcome) {}

// Applied does nothing.
func (NopMetrics) Applied(string, kvindex.ApplyStats) {}

// Sequence does nothing.
func (NopMetrics) Sequence(string, SeqEvent) {}
