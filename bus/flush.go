package bus

import (
	"context"

	"github.com/nats-io/nats.go"
)

// confirm waits (up to flushTimeout) until the server holds every
// subscription made on nc so far. A connection that is not up (an outage,
// or a first connect still being retried: nats.RetryOnFailedConnect) has
// no server to ask; its subscriptions are sent when it connects, so
// confirm returns at once rather than holding the start for a timeout.
func confirm(ctx context.Context, nc *nats.Conn) error {
	if !nc.IsConnected() {
		return nil
	}
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	return nc.FlushWithContext(fctx)
}
