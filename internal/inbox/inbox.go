// Package inbox is the bounded queue between the goroutines that hand a
// consumer work one item at a time (the transports delivering KV event
// batches) and the one goroutine that does it (the event core).
//
// A Go channel wakes the consumer, or a waiting producer, for every item
// once it is full or empty in turn: under a steady stream of batches that
// is a futex wake-up and a move of the consumer to another core per batch,
// which costs more CPU than applying a small batch. Here the consumer takes
// everything queued at once, a producer wakes it only when the queue was
// empty, and producers waiting for room are woken together when the
// consumer takes, so a busy stream costs a wake-up per take, not per item.
package inbox

import (
	"context"
	"errors"
	"sync"
)

// ErrStopped is returned by Put when its stop channel is closed.
var ErrStopped = errors.New("inbox: consumer stopped")

// Queue is a FIFO of at most Limit items. Any number of goroutines may
// Offer and Put; one goroutine waits on Ready and Takes.
type Queue[T any] struct {
	mu    sync.Mutex
	items []T
	limit int
	ready chan struct{} // holds a token while items may be non-empty
	room  chan struct{} // closed by the next Take; nil while nobody waits for room
}

// New returns a queue that holds at most limit items (at least 1).
func New[T any](limit int) *Queue[T] {
	return &Queue[T]{limit: max(limit, 1), ready: make(chan struct{}, 1)}
}

// Limit is the most items the queue holds.
func (q *Queue[T]) Limit() int { return q.limit }

// Len is the number of items queued now.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// push appends v if there is room; caller holds mu, which push releases.
func (q *Queue[T]) push(v T) bool {
	if len(q.items) >= q.limit {
		return false
	}
	q.items = append(q.items, v)
	first := len(q.items) == 1
	q.mu.Unlock()
	if first {
		select {
		case q.ready <- struct{}{}:
		default: // a token is already there
		}
	}
	return true
}

// Offer queues v unless the queue is full, and reports whether it did.
func (q *Queue[T]) Offer(v T) bool {
	q.mu.Lock()
	if q.push(v) {
		return true
	}
	q.mu.Unlock()
	return false
}

// Put queues v, waiting while the queue is full, until ctx ends (its error
// is returned) or stop is closed (ErrStopped).
func (q *Queue[T]) Put(ctx context.Context, stop <-chan struct{}, v T) error {
	for {
		q.mu.Lock()
		if q.push(v) {
			return nil
		}
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return ErrStopped
		}
	}
}

// Ready receives a token when items may be queued; the consumer then
// Takes. A token with nothing queued is harmless: Take returns none.
func (q *Queue[T]) Ready() <-chan struct{} { return q.ready }

// Take returns every queued item, in order, and keeps spare (its length
// ignored) as the storage of the items queued next, so that a consumer
// that hands back the slice it got last time allocates nothing. The
// consumer must not keep the slice it hands back; it should clear it
// first if its items hold memory that must be freed.
func (q *Queue[T]) Take(spare []T) []T {
	q.mu.Lock()
	items := q.items
	q.items = spare[:0]
	room := q.room
	q.room = nil
	q.mu.Unlock()
	if room != nil {
		close(room)
	}
	return items
}
