package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Arrival says when flows start.
type Arrival struct {
	// Kind is "trace" (each flow at its At), "poisson" (exponential gaps
	// at Rate flows per second) or "concurrency" (Concurrency flows in
	// flight at all times).
	Kind        string
	Rate        float64
	Concurrency int
	// Seed drives the Poisson gaps.
	Seed uint64
}

// Arrival kinds.
const (
	ArrivalTrace       = "trace"
	ArrivalPoisson     = "poisson"
	ArrivalConcurrency = "concurrency"
)

// Validate reports an arrival process that cannot run.
func (a Arrival) Validate() error {
	switch a.Kind {
	case ArrivalTrace:
	case ArrivalPoisson:
		if a.Rate <= 0 {
			return fmt.Errorf("poisson arrival: rate %v must be positive", a.Rate)
		}
	case ArrivalConcurrency:
		if a.Concurrency <= 0 {
			return fmt.Errorf("concurrency arrival: %d must be positive", a.Concurrency)
		}
	default:
		return fmt.Errorf("arrival %q: want trace, poisson or concurrency", a.Kind)
	}
	return nil
}

// RunOptions configures one run.
type RunOptions struct {
	Arrival Arrival
	// Duration, when positive, stops starting flows after this long;
	// requests in flight finish.
	Duration time.Duration
	// Progress, when set, is told about every finished request.
	Progress func(done, errors int)
}

// Run replays the workload with client and returns one Result per request
// sent, in completion order. It returns when every started flow has ended;
// cancelling ctx aborts the requests in flight.
func Run(ctx context.Context, c *Client, w *Workload, opt RunOptions) ([]Result, error) {
	if err := opt.Arrival.Validate(); err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		results = make([]Result, 0, w.Requests())
		nerr    int
		wg      sync.WaitGroup
	)
	start := time.Now()
	runFlow := func(fi int) {
		f := &w.Flows[fi]
		for i := range f.Items {
			if i > 0 && f.Think > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(f.Think):
				}
			}
			if ctx.Err() != nil {
				return
			}
			r := c.Do(ctx, &f.Items[i])
			r.Ref, r.Follows = ItemRef{Flow: fi, Item: i}, f.Items[i].Follows
			mu.Lock()
			results = append(results, r)
			if r.Err != nil {
				nerr++
			}
			done, ne := len(results), nerr
			mu.Unlock()
			if opt.Progress != nil {
				opt.Progress(done, ne)
			}
		}
	}
	expired := func() bool { return opt.Duration > 0 && time.Since(start) >= opt.Duration }
	switch opt.Arrival.Kind {
	case ArrivalConcurrency:
		next := make(chan int)
		for range opt.Arrival.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for fi := range next {
					runFlow(fi)
				}
			}()
		}
	feed:
		for i := range w.Flows {
			if expired() {
				break
			}
			select {
			case next <- i:
			case <-ctx.Done():
				break feed
			}
		}
		close(next)
	default:
		rng := rand.New(rand.NewPCG(opt.Arrival.Seed, 0x6b7662656e6368))
		var at time.Duration
		timer := time.NewTimer(0)
		defer timer.Stop()
	schedule:
		for i := range w.Flows {
			if opt.Arrival.Kind == ArrivalTrace {
				at = w.Flows[i].At
			} else if i > 0 {
				at += time.Duration(rng.ExpFloat64() / opt.Arrival.Rate * float64(time.Second))
			}
			if opt.Duration > 0 && at >= opt.Duration {
				break
			}
			if wait := time.Until(start.Add(at)); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					break schedule
				}
			}
			wg.Add(1)
			go func(fi int) {
				defer wg.Done()
				runFlow(fi)
			}(i)
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return results, fmt.Errorf("run interrupted: %w", err)
	}
	return results, nil
}
