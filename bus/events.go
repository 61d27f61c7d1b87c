package bus

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// PublishEvents encodes b and publishes it on worker's events subject with seq in
// SeqHeader.
func PublishEvents(nc *nats.Conn, ns, worker string, seq uint64, b vllmwire.EventBatch) error {
	data, err := vllmwire.EncodeBatch(b)
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
