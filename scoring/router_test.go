package scoring

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunSweepsUntilCancelled(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.MaxRequestAge = 20 * time.Millisecond
	r := newTestScheduler(t, o, 1)
	if _, err := r.Route(t.Context(), &Request{ID: "lost", Model: "m", PromptTokens: 64}, cands(0), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		r.Run(ctx)
		close(done)
	}()
	clock.Advance(time.Minute)
	waitFor(t, func() bool { return !r.Pool().Active("lost") }, "the lost request swept")
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// Concurrent routing, cancelling and freeing through a saturating queue
// ends with no waiter and no load left.
func TestConcurrentLifecycleLeavesNoLoad(t *testing.T) {
	o := testOptions(newFakeClock(), 1)
	o.QueueThreshold = 1
	o.QueueMaxWait = 10 * time.Second
	var queued atomic.Int64
	o.Metrics = &countingMetrics{queued: &queued}
	r, err := NewScheduler(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		s := spec(fmt.Sprint("w", i))
		s.MaxNumBatchedTokens = 300
		if err := r.Pool().Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	var wg, lifetimes sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 150 {
				id := fmt.Sprintf("g%d-%d", g, i)
				req := &Request{ID: id, Model: "m", PromptTokens: 100 + rng.IntN(400), Hashes: hashes(uint64(rng.IntN(3)), 4, 2, g*1000+i)}
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(10) == 0 {
					cancel()
				}
				cs := r.Pool().AppendCandidates(nil, "m")
				for j := range cs {
					cs[j].MatchedBlocks = rng.IntN(5)
				}
				_, err := r.Route(ctx, req, cs, nil)
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					outcomes["routed"]++
				case errors.Is(err, context.Canceled):
					outcomes["cancelled"]++
				default:
					outcomes[err.Error()]++
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				// The response streams on for a moment while this
				// goroutine routes its next request.
				out := rng.IntN(100)
				life := time.Duration(rng.IntN(2000)) * time.Microsecond
				lifetimes.Add(1)
				time.AfterFunc(life, func() {
					defer lifetimes.Done()
					r.Pool().PrefillDone(id)
					r.Pool().Progress(id, out)
					r.Pool().Free(id)
				})
			}
		})
	}
	wg.Wait()
	lifetimes.Wait()
	if queued.Load() == 0 {
		t.Error("no request ever waited: the test did not exercise the queue")
	}
	if r.QueueLen() != 0 {
		t.Errorf("queue holds %d after everyone finished", r.QueueLen())
	}
	for _, l := range r.Pool().Snapshot() {
		if l.ActiveBlocks != 0 || l.ActiveRequests != 0 || l.PrefillTokens != 0 || l.PrefillRequests != 0 {
			t.Errorf("load left: %+v", l)
		}
	}
	if outcomes["routed"] < 1000 || len(outcomes) > 2 {
		t.Errorf("outcomes %v", outcomes)
	}
}

type countingMetrics struct {
	NopMetrics
	queued *atomic.Int64
}

func (m *countingMetrics) Queued() { m.queued.Add(1) }
