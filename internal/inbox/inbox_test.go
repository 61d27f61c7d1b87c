package inbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Every item put by several producers is taken exactly once, in each
// producer's order, through a queue far smaller than the stream, with
// producers waiting for room.
func TestQueueKeepsEveryItemInOrder(t *testing.T) {
	const producers, each = 4, 20000
	q := New[[2]int](64)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				if err := q.Put(context.Background(), nil, [2]int{p, i}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := make([]int, producers)
	var batch [][2]int
	takes, got := 0, 0
	for got < producers*each {
		<-q.Ready()
		batch = q.Take(batch)
		if len(batch) > q.Limit() {
			t.Fatalf("took %d items from a queue of %d", len(batch), q.Limit())
		}
		takes++
		for _, it := range batch {
			if it[1] != next[it[0]] {
				t.Fatalf("producer %d: got item %d, want %d", it[0], it[1], next[it[0]])
			}
			next[it[0]]++
			got++
		}
	}
	wg.Wait()
	if q.Len() != 0 {
		t.Fatalf("%d items left after all were taken", q.Len())
	}
	if takes >= got {
		t.Errorf("%d takes for %d items: the consumer never took more than one at a time", takes, got)
	}
}

func TestOfferDropsWhenFull(t *testing.T) {
	q := New[int](3)
	for i := range 3 {
		if !q.Offer(i) {
			t.Fatalf("offer %d refused with room", i)
		}
	}
	if q.Offer(3) {
		t.Fatal("offer accepted into a full queue")
	}
	if got := q.Take(nil); len(got) != 3 || got[0] != 0 || got[2] != 2 {
		t.Fatalf("took %v, want [0 1 2]", got)
	}
	if !q.Offer(4) {
		t.Fatal("offer refused after a take")
	}
}

// A token is pending whenever items are queued: after a take, the next
// item signals Ready again.
func TestReadySignalsAfterTake(t *testing.T) {
	q := New[int](8)
	q.Offer(1)
	<-q.Ready()
	_ = q.Take(nil)
	select {
	case <-q.Ready():
		t.Fatal("ready with nothing queued since the take")
	default:
	}
	q.Offer(2)
	select {
	case <-q.Ready():
	default:
		t.Fatal("no ready token for an item queued after a take")
	}
}

func TestPutStopsOnContextAndStop(t *testing.T) {
	q := New[int](1)
	q.Offer(0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := q.Put(ctx, nil, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put into a full queue: %v, want the context's deadline", err)
	}
	stop := make(chan struct{})
	close(stop)
	if err := q.Put(context.Background(), stop, 1); !errors.Is(err, ErrStopped) {
		t.Fatalf("put with the consumer stopped: %v, want ErrStopped", err)
	}
	if q.Len() != 1 {
		t.Fatalf("%d items queued, want the 1 that fitted", q.Len())
	}
}
