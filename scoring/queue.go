package scoring

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Policy orders the admission queue.
type Policy int

const (
	// PolicyFCFS serves the earliest arrival first; priority counts as
	// seconds of earlier arrival.
	PolicyFCFS Policy = iota
	// PolicyWSPT (weighted shortest processing time) serves the highest
	// (1 + priority) ÷ uncached tokens first.
	PolicyWSPT
	// PolicyLCFS serves the latest arrival first; for comparison only.
	PolicyLCFS
)

var policyNames = []string{"fcfs", "wspt", "lcfs"}

// PolicyNames lists the valid --queue-policy names, default first.
func PolicyNames() []string { return append([]string(nil), policyNames...) }

// String returns the policy's name.
func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// ParsePolicy returns the policy named s (see PolicyNames), ignoring case.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown queue policy %q (valid: %s)", s, strings.Join(policyNames, ", "))
}

// ErrShed is what every *ShedError matches with errors.Is.
var ErrShed = errors.New("scoring: request shed")

// Shed reasons.
const (
	ShedQueueFull = "queue_full"
	ShedMaxWait   = "max_wait"
)

// ShedError reports a request the admission queue refused; the caller
// answers 429.
type ShedError struct {
	// Reason is ShedQueueFull or ShedMaxWait.
	Reason string
	// Model is the requested model.
	Model string
	// Waited is how long the request waited before being shed.
	Waited time.Duration
}

// Error implements error.
func (e *ShedError) Error() string {
	return fmt.Sprintf("scoring: request for model %q shed (%s) after %s", e.Model, e.Reason, e.Waited.Round(time.Millisecond))
}

// Unwrap makes errors.Is(err, ErrShed) hold.
func (e *ShedError) Unwrap() error { return ErrShed }

// ParsePriority parses a priority from the x-kvroute-priority header or
// nvext.agent_hints.priority. Negative values clamp to 0; an empty string
// is 0; NaN, infinities and non-numbers are errors.
func ParsePriority(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("priority %q is not a finite number", s)
	}
	return ClampPriority(v), nil
}

// ClampPriority maps negative and NaN priorities to 0.
func ClampPriority(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return v
}

// waiter is one request in the admission queue.
type waiter struct {
	req     *Request
	cands   []Candidate
	exp     *Explanation
	arrival time.Time
	key     float64 // lower is served first
	seq     uint64  // arrival order breaks key ties
	index   int     // position in its heap; -1 once out
	done    chan struct{}
	// notify, when set, receives the outcome instead of a goroutine
	// waiting on done (Submit); it runs with the queue's lock held.
	notify func(Decision, error)
	dec    Decision
	err    error
}

type waiterHeap []*waiter

func (h waiterHeap) Len() int { return len(h) }
func (h waiterHeap) Less(i, j int) bool {
	if h[i].key != h[j].key {
		return h[i].key < h[j].key
	}
	return h[i].seq < h[j].seq
}
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *waiterHeap) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}

// admission is the Scheduler's queue: one heap per model, drained in policy
// order whenever capacity may have changed. Dispatch happens under mu, so
// each admitted waiter's Add is visible before the next is examined. The
// head of a model's line blocks those behind it even when they were
// restricted to a different subset of workers: a simplification that only
// matters when subset hints split one model's fleet.
type admission struct {
	r      *Scheduler
	policy Policy
	start  time.Time

	n      atomic.Int64 // waiters across all models
	mu     sync.Mutex
	models map[string]*waiterHeap
	seq    uint64
}

func newAdmission(r *Scheduler, p Policy) *admission {
	return &admission{r: r, policy: p, start: r.opts.Now(), models: make(map[string]*waiterHeap)}
}

// orderKey returns the waiter's place in line, lower first.
func (q *admission) orderKey(w *waiter) float64 {
	arrival := w.arrival.Sub(q.start).Seconds()
	switch q.policy {
	case PolicyWSPT:
		return -(1 + w.req.Priority) / float64(max(q.r.pool.minUncached(w.req, w.cands), 1))
	case PolicyLCFS:
		return -(arrival + w.req.Priority)
	}
	return arrival - w.req.Priority
}

func (q *admission) admit(ctx context.Context, req *Request, cands []Candidate, exp *Explanation) (Decision, error) {
	if d, ok, err := q.tryNow(req, cands, exp); ok || err != nil {
		return d, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	w, err := q.enqueue(req, cands, exp, nil)
	if err != nil {
		return Decision{}, err
	}
	timer := time.NewTimer(q.r.limits().QueueMaxWait)
	defer timer.Stop()
	select {
	case <-w.done:
		q.r.opts.Metrics.Dequeued(q.r.opts.Now().Sub(w.arrival))
		return w.dec, w.err
	case <-ctx.Done():
		return q.leave(w, ctx.Err(), true)
	case <-timer.C:
		return q.leave(w, &ShedError{Reason: ShedMaxWait, Model: req.Model, Waited: q.r.opts.Now().Sub(w.arrival)}, false)
	}
}

// tryNow routes at once when nobody of the model waits and some candidate
// has room: ok reports a committed decision.
func (q *admission) tryNow(req *Request, cands []Candidate, exp *Explanation) (d Decision, ok bool, err error) {
	if q.n.Load() != 0 && !q.modelEmpty(req.Model) {
		return Decision{}, false, nil
	}
	d, saturated, err := q.r.decide(req, cands, exp, q.r.limits().QueueThreshold, false)
	if err != nil {
		return Decision{}, false, err
	}
	if saturated {
		return Decision{}, false, nil
	}
	return d, true, q.r.commit(req, d)
}

// enqueue puts a waiter in line (or sheds it when the queue is full) and
// dispatches at once, in case capacity freed meanwhile.
func (q *admission) enqueue(req *Request, cands []Candidate, exp *Explanation, notify func(Decision, error)) (*waiter, error) {
	w := &waiter{req: req, cands: cands, exp: exp, arrival: q.r.opts.Now(), done: make(chan struct{}), notify: notify}
	w.key = q.orderKey(w)
	q.mu.Lock()
	if int(q.n.Load()) >= q.r.limits().QueueMaxLength {
		q.mu.Unlock()
		q.r.opts.Metrics.Shed(ShedQueueFull)
		return nil, &ShedError{Reason: ShedQueueFull, Model: req.Model}
	}
	h := q.models[req.Model]
	if h == nil {
		h = &waiterHeap{}
		q.models[req.Model] = h
	}
	q.seq++
	w.seq = q.seq
	heap.Push(h, w)
	q.n.Add(1)
	q.mu.Unlock()
	q.r.opts.Metrics.Queued()
	q.dispatch(req.Model)
	return w, nil
}

// shedExpired sheds the waiters of Submit that have waited longer than
// QueueMaxWait by the router's clock, in arrival order, and returns how
// many it shed. Blocking waiters time out on their own timers.
func (q *admission) shedExpired() int {
	now := q.r.opts.Now()
	maxWait := q.r.limits().QueueMaxWait
	var gone []*waiter
	q.mu.Lock()
	for _, h := range q.models {
		kept := (*h)[:0]
		for _, w := range *h {
			if w.notify != nil && now.Sub(w.arrival) > maxWait {
				w.index = -1
				gone = append(gone, w)
			} else {
				kept = append(kept, w)
			}
		}
		clear((*h)[len(kept):])
		*h = kept
		for i, w := range kept {
			w.index = i
		}
		heap.Init(h)
	}
	q.n.Add(-int64(len(gone)))
	q.mu.Unlock()
	slices.SortFunc(gone, func(a, b *waiter) int { return cmp.Compare(a.seq, b.seq) })
	for _, w := range gone {
		q.r.opts.Metrics.Shed(ShedMaxWait)
		w.notify(Decision{}, &ShedError{Reason: ShedMaxWait, Model: w.req.Model, Waited: now.Sub(w.arrival)})
	}
	return len(gone)
}

// leave takes a waiter out of line with err. If a dispatch admitted it in
// the meantime, a cancelled waiter gives its load back while a timed-out
// one keeps its decision.
func (q *admission) leave(w *waiter, err error, cancelled bool) (Decision, error) {
	q.mu.Lock()
	if w.index >= 0 {
		heap.Remove(q.models[w.req.Model], w.index)
		q.n.Add(-1)
		q.mu.Unlock()
		var shed *ShedError
		if errors.As(err, &shed) {
			q.r.opts.Metrics.Shed(shed.Reason)
		}
		return Decision{}, err
	}
	q.mu.Unlock()
	<-w.done
	if !cancelled {
		return w.dec, w.err
	}
	if w.err == nil {
		q.r.pool.Free(w.req.ID)
	}
	return Decision{}, err
}

func (q *admission) modelEmpty(model string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.models[model]
	return h == nil || h.Len() == 0
}

// dispatch admits the model's waiters in order while their candidates have
// room.
func (q *admission) dispatch(model string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.models[model]
	for h != nil && h.Len() > 0 {
		w := (*h)[0]
		d, saturated, err := q.r.decide(w.req, w.cands, w.exp, q.r.limits().QueueThreshold, false)
		if saturated {
			return
		}
		heap.Pop(h)
		q.n.Add(-1)
		if err == nil {
			err = q.r.commit(w.req, d)
		}
		w.dec, w.err = d, err
		close(w.done)
		if w.notify != nil {
			w.notify(d, err)
		}
	}
}

// kick re-examines every model's waiters; the pool calls it whenever
// capacity may have changed.
func (q *admission) kick() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	models := make([]string, 0, len(q.models))
	for m, h := range q.models {
		if h.Len() > 0 {
			models = append(models, m)
		}
	}
	q.mu.Unlock()
	for _, m := range models {
		q.dispatch(m)
	}
}
