package bus

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// flushTimeout bounds how long a subscription waits for the server to
// confirm it.
const flushTimeout = 5 * time.Second

// eventDelivery turns one message on the events subjects into a delivery:
// the worker from the subject (empty when the subject is not under
// prefix), the number from SeqHeader.
func eventDelivery(prefix string, m *nats.Msg) kvevents.Delivery {
	worker, ok := strings.CutPrefix(m.Subject, prefix)
	if !ok {
		worker = ""
	}
	d := kvevents.Delivery{Worker: worker, Payload: m.Data}
	seq, err := strconv.ParseUint(m.Header.Get(SeqHeader), 10, 64)
	if err != nil {
		d.NoSeq = true
	}
	d.Seq = seq
	return d
}

// SubscribeEvents delivers the namespace's KV event batches
// (EventsWildcard) to core until ctx ends; the subscription is live on the
// server when it returns. A batch that finds core's buffer full is dropped,
// as NATS drops for a slow consumer: the worker's next batch shows the gap.
func SubscribeEvents(ctx context.Context, nc *nats.Conn, namespace string, core *kvevents.Core) error {
	subj := EventsWildcard(namespace)
	prefix := strings.TrimSuffix(subj, ">")
	sub, err := nc.Subscribe(subj, func(m *nats.Msg) { core.Offer(eventDelivery(prefix, m)) })
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subj, err)
	}
	if err := confirm(ctx, nc); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("subscribe %s: flush: %w", subj, err)
	}
	go func() { <-ctx.Done(); _ = sub.Unsubscribe() }()
	return nil
}

// ConsumeEventStream delivers the durable event stream (EnsureEventStream)
// to core from the message after core.Cursor() (0: the whole stream) until
// ctx ends, through an ordered consumer: no server-side state to clean up,
// and it recreates itself after a reconnect from the last sequence
// delivered. Each delivery carries its stream sequence as the cursor. The
// handler waits while core's buffer is full, so nothing is dropped.
func ConsumeEventStream(ctx context.Context, js jetstream.JetStream, stream, namespace string, core *kvevents.Core, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	subj := EventsWildcard(namespace)
	prefix := strings.TrimSuffix(subj, ">")
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if from := core.Cursor(); from > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	cons, err := js.OrderedConsumer(cctx, stream, occ)
	if err != nil {
		return fmt.Errorf("consume stream %s: %w", stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			log.Warn("KV event from the stream without metadata", "subject", m.Subject(), "err", err)
			return
		}
		d := eventDelivery(prefix, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		d.Cursor = md.Sequence.Stream
		_ = core.Deliver(ctx, d)
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		log.Debug("KV event stream consumer", "stream", stream, "err", err)
	}))
	if err != nil {
		return fmt.Errorf("consume stream %s: %w", stream, err)
	}
	go func() { <-ctx.Done(); cc.Stop() }()
	return nil
}
