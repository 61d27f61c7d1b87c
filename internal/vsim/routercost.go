package vsim

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// RouterCost is what the router's side of one run cost in CPU, apart from
// the simulated engines: the index lookups, the decisions, the lifecycle
// calls, the load reports and the KV events the router would handle in
// production, each timed by its thread's CPU clock around the real call.
// It is measured only when asked for (SweepOptions.RouterCost): CPU time
// differs from run to run, so it never enters the default report.
type RouterCost struct {
	// Hash is kvindex.HashBlocks over the prompt's tokens, once per
	// request (the router hashes every prompt it tokenizes).
	Hash CallCost `json:"hash"`
	// Match is kvindex.Index.Match over every candidate, once per
	// request (kv mode only).
	Match CallCost `json:"match"`
	// Decide is Pool.AppendCandidates and Scheduler.Submit: admission,
	// every candidate's Load, Mode.Pick and the Pool.Add that follows. A
	// request the admission queue holds is picked later, inside the
	// lifecycle call that makes room, and counts there.
	Decide CallCost `json:"decide"`
	// Lifecycle is Pool.PrefillDone, Progress and Free.
	Lifecycle CallCost `json:"lifecycle"`
	// Reports is Pool.SetLoadReport, one per worker per report period.
	Reports CallCost `json:"reports"`
	// Apply is one KV event batch: vllmwire.DecodeBatch and Index.Apply
	// (with the pending overlay's BlocksStored).
	Apply CallCost `json:"apply"`
	// Timers is the admission queue's expiry and the pool's sweep.
	Timers CallCost `json:"timers"`

	// RouterCPUSeconds sums the above; RunCPUSeconds is the whole run's
	// thread CPU (engines and bookkeeping included).
	RouterCPUSeconds float64 `json:"router_cpu_seconds"`
	RunCPUSeconds    float64 `json:"run_cpu_seconds"`
	// PerRequestUs is RouterCPUSeconds ÷ requests: the router CPU one
	// request costs, all its calls and its share of events and reports.
	PerRequestUs float64 `json:"per_request_us"`
	// RequestsPerSecond and the event rates are per second of virtual
	// time (first arrival to last finish): what the fleet would send a
	// router in real time.
	RequestsPerSecond float64 `json:"requests_per_second"`
	EventBatches      int     `json:"event_batches"`
	// EventBlocks counts block hashes in BlockStored and BlockRemoved
	// events.
	EventBlocks          int     `json:"event_blocks"`
	EventBlocksPerSecond float64 `json:"event_blocks_per_second"`
	// ApplyBlocksPerCPUSecond is the rate one core applies them at, from
	// Apply's CPU time.
	ApplyBlocksPerCPUSecond float64 `json:"apply_blocks_per_cpu_second"`
	// CoresNeeded is RouterCPUSeconds ÷ the virtual span: the cores a
	// router would spend to keep up with this fleet in real time.
	CoresNeeded float64 `json:"cores_needed"`

	// IndexEntries (block, worker) pairs and IndexBytes (kvindex.Stats'
	// estimate) at the end of the run; IndexHeapBytes is the live heap
	// the index held, measured by dropping it after a GC (0 unless runs
	// went one at a time: other runs' allocations would blur it).
	IndexEntries   int   `json:"index_entries"`
	IndexBytes     int   `json:"index_bytes"`
	IndexHeapBytes int64 `json:"index_heap_bytes,omitempty"`
}

// CallCost summarises the CPU time of one kind of call.
type CallCost struct {
	Calls   int     `json:"calls"`
	TotalMs float64 `json:"total_ms"`
	P50Us   float64 `json:"p50_us"`
	P99Us   float64 `json:"p99_us"`
	MaxUs   float64 `json:"max_us"`
}

// meter times the router's calls of one run. A nil meter does nothing, so
// a run without RouterCost pays one nil check per call.
type meter struct {
	start           time.Duration
	calls           [numCalls]samples
	batches, blocks int
	heap            bool
}

// call names a kind of router call the meter times.
type call uint8

const (
	callHash call = iota
	callMatch
	callDecide
	callLifecycle
	callReports
	callApply
	callTimers
	numCalls
)

// samples are CPU times in nanoseconds.
type samples []uint32

// newMeter locks the calling goroutine to its thread, whose CPU clock it
// reads; done must be called on the same goroutine.
func newMeter(heap bool) *meter {
	runtime.LockOSThread()
	return &meter{start: threadCPU(), heap: heap}
}

// now reads the thread's CPU clock, or 0 for a nil meter.
func (m *meter) now() time.Duration {
	if m == nil {
		return 0
	}
	return threadCPU()
}

// add records a call of kind c that began at t, less exclude (a call
// inside it that is counted apart), and returns its time.
func (m *meter) add(c call, t, exclude time.Duration) time.Duration {
	if m == nil {
		return 0
	}
	d := threadCPU() - t
	m.calls[c] = append(m.calls[c], uint32(min(max(d-exclude, 0), time.Duration(1<<32-1))))
	return d
}

// since is the CPU time since t, recorded nowhere.
func (m *meter) since(t time.Duration) time.Duration {
	if m == nil {
		return 0
	}
	return threadCPU() - t
}

// events counts an applied batch of n block hashes.
func (m *meter) events(n int) {
	if m == nil {
		return
	}
	m.batches++
	m.blocks += n
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func (s samples) cost() CallCost {
	c := CallCost{Calls: len(s)}
	if len(s) == 0 {
		return c
	}
	var sum uint64
	for _, v := range s {
		sum += uint64(v)
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	at := func(q float64) float64 { return float64(sorted[int(q*float64(len(sorted)-1))]) / 1e3 }
	c.TotalMs = float64(sum) / 1e6
	c.P50Us, c.P99Us, c.MaxUs = at(0.5), at(0.99), at(1)
	return c
}

// abandon unlocks the thread of a run that failed.
func (m *meter) abandon() {
	if m != nil {
		runtime.UnlockOSThread()
	}
}

// finish fills the run's RouterCost and unlocks the thread. It drops the
// runner's index to measure its heap when the meter was asked to.
func (m *meter) finish(r *runner, res *Result) {
	rc := &RouterCost{
		Hash: m.calls[callHash].cost(), Match: m.calls[callMatch].cost(), Decide: m.calls[callDecide].cost(),
		Lifecycle: m.calls[callLifecycle].cost(), Reports: m.calls[callReports].cost(), Apply: m.calls[callApply].cost(),
		Timers:       m.calls[callTimers].cost(),
		EventBatches: m.batches, EventBlocks: m.blocks,
	}
	rc.RunCPUSeconds = (threadCPU() - m.start).Seconds()
	for _, c := range []CallCost{rc.Hash, rc.Match, rc.Decide, rc.Lifecycle, rc.Reports, rc.Apply, rc.Timers} {
		rc.RouterCPUSeconds += c.TotalMs / 1e3
	}
	rc.PerRequestUs = rc.RouterCPUSeconds / float64(max(res.Requests, 1)) * 1e6
	if span := res.SpanSeconds; span > 0 {
		rc.RequestsPerSecond = float64(res.Requests) / span
		rc.EventBlocksPerSecond = float64(m.blocks) / span
		rc.CoresNeeded = rc.RouterCPUSeconds / span
	}
	if rc.Apply.TotalMs > 0 {
		rc.ApplyBlocksPerCPUSecond = float64(m.blocks) / (rc.Apply.TotalMs / 1e3)
	}
	st := r.index.Stats()
	rc.IndexEntries, rc.IndexBytes = st.Entries, st.Bytes
	if m.heap {
		rc.IndexHeapBytes = r.dropIndexHeap()
	}
	runtime.UnlockOSThread()
	res.RouterCost = rc
}

// dropIndexHeap releases the runner's index and returns the live heap it
// held: the heap after a GC with it, less the heap after a GC without it.
func (r *runner) dropIndexHeap() int64 {
	// Two collections each: the first only moves sync.Pool caches to
	// their victim lists, which the second frees.
	var with, without runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&with)
	r.index.SetObserver(nil)
	r.index = nil
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&without)
	// The rest of the runner (engines, pool) must stay live through the
	// second measurement, or it would count as the index's.
	runtime.KeepAlive(r)
	return int64(with.HeapAlloc) - int64(without.HeapAlloc)
}

// routerCostMarkdown renders the sweep's router cost, one row per mode and
// load.
func (r *Report) routerCostMarkdown(b *strings.Builder) {
	if len(r.RouterCost) == 0 {
		return
	}
	b.WriteString("\nRouter CPU (thread CPU time around the router's calls; engines excluded). ")
	b.WriteString("Per request: all of the router's CPU ÷ requests. Cores: router CPU ÷ virtual span.\n\n")
	b.WriteString("| load | mode | req/s | router CPU / request | cores | Match p50 / p99 | decide p50 / p99 | apply p50 / p99 | event blocks/s | apply blocks/CPU-s | index entries | index MB (est. / heap) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for li, l := range r.Loads {
		for _, m := range r.Order {
			cs := r.RouterCost[m]
			if li >= len(cs) || cs[li] == nil {
				continue
			}
			c := cs[li]
			heap := "–"
			if c.IndexHeapBytes != 0 {
				heap = fmt.Sprintf("%.0f", float64(c.IndexHeapBytes)/(1<<20))
			}
			match := "–"
			if c.Match.Calls > 0 {
				match = fmt.Sprintf("%.1f / %.1f µs", c.Match.P50Us, c.Match.P99Us)
			}
			apply, rate := "–", "–"
			if c.Apply.Calls > 0 {
				apply = fmt.Sprintf("%.1f / %.1f µs", c.Apply.P50Us, c.Apply.P99Us)
				rate = fmt.Sprintf("%.2g", c.ApplyBlocksPerCPUSecond)
			}
			fmt.Fprintf(b, "| %g | %s | %.0f | %.1f µs | %.2f | %s | %.1f / %.1f µs | %s | %.3g | %s | %d | %.0f / %s |\n",
				l, m, c.RequestsPerSecond, c.PerRequestUs, c.CoresNeeded, match, c.Decide.P50Us, c.Decide.P99Us,
				apply, c.EventBlocksPerSecond, rate, c.IndexEntries, float64(c.IndexBytes)/(1<<20), heap)
		}
	}
}
