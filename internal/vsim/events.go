package vsim

import (
	"container/heap"
	"time"
)

// kind says what an event does when its time comes.
type kind uint8

const (
	evArrive   kind = iota // a turn reaches the router (a = request)
	evDeliver              // an admitted request reaches its worker (a = request)
	evStepDone             // a worker's engine step ends (a = worker)
	evKV                   // a KV event batch reaches the index (a = worker, b = batch)
	evReport               // a worker publishes a load report (a = worker)
	evTick                 // the router's timers: queue max wait, request age
	evStart                // an idle worker starts its next step (a = worker)
)

// event is one entry of the simulation's agenda. seq breaks ties in the
// order events were scheduled, so a run is a pure function of its inputs.
type event struct {
	at   time.Duration
	seq  uint64
	kind kind
	a, b int32
}

type agenda []event

func (h agenda) Len() int { return len(h) }
func (h agenda) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h agenda) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *agenda) Push(x any)   { *h = append(*h, x.(event)) }
func (h *agenda) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// clock is the virtual clock and its agenda.
type clock struct {
	now  time.Duration
	seq  uint64
	todo agenda
}

// base anchors virtual time to a fixed instant, so the router's clock reads
// the same in every run.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (c *clock) time() time.Time { return base.Add(c.now) }

func (c *clock) at(t time.Duration, k kind, a, b int32) {
	c.seq++
	heap.Push(&c.todo, event{at: t, seq: c.seq, kind: k, a: a, b: b})
}

func (c *clock) next() (event, bool) {
	if len(c.todo) == 0 {
		return event{}, false
	}
	e := heap.Pop(&c.todo).(event)
	c.now = e.at
	return e, true
}
