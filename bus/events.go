package bus

import (
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

// PublishEvents encodes b and publishes it on worker's events subject with seq in
// SeqHeader.
func PublishEvents(nc *nats.Conn, ns, worker string, seq uint64, b kvindex.EventBatch) error {
	data, err := kvindex.EncodeBatch(b)
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

// BatchOutcome says what the event consumer did with one NATS message.
type BatchOutcome string

// Batch outcomes reported to EventMetrics.
const (
	BatchApplied       BatchOutcome = "applied"
	BatchDecodeError   BatchOutcome = "decode_error"
	BatchUnknownWorker BatchOutcome = "unknown_worker"
	BatchDuplicate     BatchOutcome = "duplicate"
	BatchBadSubject    BatchOutcome = "bad_subject"
)

// SeqEvent is a notable change in a worker's sequence numbers.
type SeqEvent string

// Sequence events reported to EventMetrics.
const (
	SeqGap     SeqEvent = "gap"     // numbers skipped: batches were lost
	SeqRestart SeqEvent = "restart" // numbers went back, but not to 0
	SeqFresh   SeqEvent = "fresh"   // 0 after a known stream: the publisher started over
	SeqMissing SeqEvent = "missing" // no or unparsable header
	SeqJoin    SeqEvent = "join"    // first batch seen from a worker did not have sequence 0
)

// EventMetrics receives the event consumer's counters; the binary wires it to
// Prometheus. Implementations must be safe for concurrent use.
type EventMetrics interface {
	// Batch counts one message by outcome.
	Batch(worker string, outcome BatchOutcome)
	// Applied reports what Apply did with one batch.
	Applied(worker string, s kvindex.ApplyStats)
	// Sequence counts a gap, restart, fresh start or missing header.
	Sequence(worker string, ev SeqEvent)
}

// NopEventMetrics discards everything.
type NopEventMetrics struct{}

var _ EventMetrics = NopEventMetrics{}

// Batch does nothing.
func (NopEventMetrics) Batch(string, BatchOutcome) {}

// Applied does nothing.
func (NopEventMetrics) Applied(string, kvindex.ApplyStats) {}

// Sequence does nothing.
func (NopEventMetrics) Sequence(string, SeqEvent) {}
