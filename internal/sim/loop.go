package sim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// errWorkerStopped ends streams of requests still in flight when a worker
// stops.
var errWorkerStopped = errors.New("worker stopped")

// maxLag bounds how far the simulated clock may fall behind real time
// before it is resynchronised, so a starved process does not replay a burst.
const maxLag = 50 * time.Millisecond

// minSleep is the shortest wait worth a timer; shorter debts accumulate.
const minSleep = 200 * time.Microsecond

// command is an operation handed to the loop goroutine.
type command struct {
	kind   commandKind
	id     uint64
	prompt []int32
	max    int
	st     *stream
	mm     []kvindex.MMPlacement // the prompt's images (vision-language models)
}

type commandKind uint8

const (
	cmdAdd commandKind = iota
	cmdAbort
	cmdReset
	cmdResync
)

// runner owns an Engine and steps it in scaled real time on one goroutine.
// Other goroutines talk to it only through submit.
type runner struct {
	eng    *Engine
	timing *TimingModel
	total  int
	// flush runs on the loop after commands are applied and after each
	// step; the worker hands the engine's KV events on from there.
	flush func()

	mu      sync.Mutex
	inbox   []command
	spare   []command
	wake    chan struct{}
	streams map[uint64]*stream

	// Snapshot for metrics and load reports, written by the loop.
	running, waiting, usedBlocks atomic.Int64
	prefixQueries, prefixHits    atomic.Uint64
	steps                        atomic.Uint64
	resyncs                      atomic.Uint64
	// lag is the real time, in ns, the clock skipped when the loop fell
	// more than maxLag behind: simulated time that never happened.
	lag  atomic.Int64
	last Stats // what the atomics hold; loop only
}

func newRunner(eng *Engine, timing *TimingModel) *runner {
	return &runner{
		eng:     eng,
		timing:  timing,
		total:   eng.Config().TotalTokens(),
		wake:    make(chan struct{}, 1),
		streams: make(map[uint64]*stream),
	}
}

func (r *runner) submit(c command) {
	r.mu.Lock()
	r.inbox = append(r.inbox, c)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// drain applies queued commands to the engine.
func (r *runner) drain() {
	r.mu.Lock()
	cmds := r.inbox
	r.inbox = r.spare[:0]
	r.mu.Unlock()
	if len(cmds) == 0 {
		r.spare = cmds
		return
	}
	for i := range cmds {
		c := &cmds[i]
		switch c.kind {
		case cmdAdd:
			if err := r.eng.AddMM(c.id, c.prompt, c.max, c.mm); err != nil {
				c.st.fail(err)
				break
			}
			r.streams[c.id] = c.st
		case cmdAbort:
			r.eng.Abort(c.id)
			delete(r.streams, c.id)
		case cmdReset:
			r.eng.Reset()
		case cmdResync:
			r.eng.Resync()
			r.resyncs.Add(1)
		}
		*c = command{}
	}
	r.spare = cmds[:0]
	r.publishStats()
	if r.flush != nil {
		r.flush()
	}
}

// publishStats copies the engine's counters into the atomics readers use.
// Atomic stores are full barriers on amd64 and this runs twice a step, so
// only changed values are stored.
func (r *runner) publishStats() {
	st := r.eng.Stats()
	if st != r.last {
		r.running.Store(int64(st.Running))
		r.waiting.Store(int64(st.Waiting))
		r.usedBlocks.Store(int64(st.UsedBlocks))
		r.prefixQueries.Store(st.PrefixQueries)
		r.prefixHits.Store(st.PrefixHits)
		r.last = st
	}
}

// catchUp returns the clock the next step starts from: clock itself while it
// is at most maxLag behind now (the debt is repaid by shorter sleeps), else
// now, counting the skipped time as lag. A zero clock (the loop was idle)
// starts at now without lag.
func (r *runner) catchUp(clock, now time.Time) time.Time {
	if clock.IsZero() {
		return now
	}
	if behind := now.Sub(clock); behind > maxLag {
		r.lag.Add(int64(behind))
		return now
	}
	return clock
}

// run steps the engine until ctx ends, then fails every open stream.
func (r *runner) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer func() {
		for id, st := range r.streams {
			st.fail(errWorkerStopped)
			delete(r.streams, id)
		}
	}()
	var clock time.Time
	for {
		r.drain()
		if !r.eng.HasWork() {
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			}
			// Idle time is not lag: the next step starts from now.
			clock = time.Time{}
			continue
		}
		res := r.eng.Step()
		r.steps.Add(1)
		d := r.timing.StepDuration(res, r.total)
		now := time.Now()
		clock = r.catchUp(clock, now)
		clock = clock.Add(d)
		at := now
		if wait := clock.Sub(now); wait > minSleep {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			at = time.Now()
		} else if ctx.Err() != nil {
			return
		}
		// Readers of the stats must not see a request running after its
		// client got the last token, so the stats go first.
		r.publishStats()
		for _, o := range res.Outputs {
			st, ok := r.streams[o.ID]
			if !ok {
				continue
			}
			st.deliver(o, at)
			if o.Finished {
				delete(r.streams, o.ID)
			}
		}
		if r.flush != nil {
			r.flush()
		}
	}
}
