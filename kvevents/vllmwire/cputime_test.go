package vllmwire

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cpuClock measures the CPU time of the benchmark's own thread, so that a
// figure taken on a loaded shared machine still says what one core does:
// wall-clock ns/op there also counts time spent waiting for a core.
type cpuClock struct {
	start time.Duration
	ok    bool
}

// startCPU locks the goroutine to its thread and reads the thread's CPU
// time; stop must be called on the same goroutine.
func startCPU() *cpuClock {
	runtime.LockOSThread()
	c := &cpuClock{}
	c.start, c.ok = threadCPU()
	return c
}

// stop returns the CPU time used since startCPU, or false where the
// platform cannot tell.
func (c *cpuClock) stop() (time.Duration, bool) {
	end, ok := threadCPU()
	runtime.UnlockOSThread()
	if !ok || !c.ok {
		return 0, false
	}
	return end - c.start, true
}

func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// reportCPU adds cpu-ns/op and, when perOp > 0, a per-second rate of
// those units computed from CPU time.
func reportCPU(b *testing.B, c *cpuClock, perOp float64, unit string) {
	d, ok := c.stop()
	if !ok || b.N == 0 {
		return
	}
	b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "cpu-ns/op")
	if perOp > 0 && d > 0 {
		b.ReportMetric(perOp*float64(b.N)/d.Seconds(), "cpu-"+unit)
	}
}
