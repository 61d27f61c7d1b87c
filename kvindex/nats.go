package kvindex

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// SeqHeader is the NATS header carrying the publisher's batch sequence
// number (decimal, starting at 0 for a fresh stream).
const SeqHeader = "Kvroute-Seq"

// EventsSubject is the subject a worker publishes its KV events on.
func EventsSubject(ns, worker string) string { return "kvroute." + ns + ".events." + worker }

// EventsWildcard matches every worker's events subject in namespace ns.
func EventsWildcard(ns string) string { return "kvroute." + ns + ".events.>" }

// Publish encodes b and publishes it on worker's events subject with seq in
// SeqHeader.
func Publish(nc *nats.Conn, ns, worker string, seq uint64, b EventBatch) error {
	data, err := EncodeBatch(b)
	if err != nil {
		return fmt.Errorf("publish KV events for %s: %w", worker, err)
	}
	msg := nats.NewMsg(EventsSubject(ns, worker))
	msg.Header.Set(SeqHeader, strconv.FormatUint(seq, 10))
	msg.Data = data
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish KV events for %s: %w", worker, err)
	}
	return nil
}

// BatchOutcome says what the consumer did with one NATS message.
type BatchOutcome string

// Batch outcomes reported to Metrics.
const (
	BatchApplied       BatchOutcome = "applied"
	BatchDecodeError   BatchOutcome = "decode_error"
	BatchUnknownWorker BatchOutcome = "unknown_worker"
	BatchDuplicate     BatchOutcome = "duplicate"
	BatchBadSubject    BatchOutcome = "bad_subject"
)

// SeqEvent is a notable change in a worker's sequence numbers.
type SeqEvent string

// Sequence events reported to Metrics.
const (
	SeqGap     SeqEvent = "gap"     // numbers skipped: batches were lost
	SeqRestart SeqEvent = "restart" // numbers went back, but not to 0
	SeqFresh   SeqEvent = "fresh"   // 0 after a known stream: the publisher started over
	SeqMissing SeqEvent = "missing" // no or unparsable header
	SeqJoin    SeqEvent = "join"    // first batch seen from a worker did not have sequence 0
)

// Metrics receives the consumer's counters; the binary wires it to
// Prometheus. Implementations must be safe for concurrent use.
type Metrics interface {
	// Batch counts one message by outcome.
	Batch(worker string, outcome BatchOutcome)
	// Applied reports what Apply did with one batch.
	Applied(worker string, s ApplyStats)
	// Sequence counts a gap, restart, fresh start or missing header.
	Sequence(worker string, ev SeqEvent)
}

// NopMetrics discards everything.
type NopMetrics struct{}

var _ Metrics = NopMetrics{}

// Batch does nothing.
func (NopMetrics) Batch(string, BatchOutcome) {}

// Applied does nothing.
func (NopMetrics) Applied(string, ApplyStats) {}

// Sequence does nothing.
func (NopMetrics) Sequence(string, SeqEvent) {}
