package sim

import (
	"context"
	"testing"
	"time"
)

func TestCatchUpCountsOnlyTheTimeTheClockSkips(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name      string
		clock     time.Time
		wantClock time.Time
		wantLag   time.Duration
	}{
		{"idle loop starts now", time.Time{}, now, 0},
		{"ahead keeps its clock", now.Add(5 * time.Millisecond), now.Add(5 * time.Millisecond), 0},
		{"a small debt is repaid, not skipped", now.Add(-maxLag), now.Add(-maxLag), 0},
		{"far behind skips to now", now.Add(-300 * time.Millisecond), now, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r runner
			if got := r.catchUp(tc.clock, now); !got.Equal(tc.wantClock) {
				t.Errorf("clock %v, want %v", got, tc.wantClock)
			}
			if got := time.Duration(r.lag.Load()); got != tc.wantLag {
				t.Errorf("lag %v, want %v", got, tc.wantLag)
			}
		})
	}
}

// A loop stalled mid-request (here by a slow flush, in production by a
// starved process) reports the stall as clock lag; time spent idle between
// requests does not count.
func TestWorkerReportsClockLagOnlyWhenItFallsBehind(t *testing.T) {
	const idle = 500 * time.Millisecond
	for _, tc := range []struct {
		name     string
		stall    time.Duration
		min, max time.Duration
	}{
		// Two idle gaps of idle each would count at least 2*idle if idle
		// counted; the bound leaves room for a starved machine's scheduler.
		{"idle gaps are not lag", 0, 0, idle - 100*time.Millisecond},
		{"a 300 ms stall is lag", 300 * time.Millisecond, 200 * time.Millisecond, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, err := NewEngine(EngineConfig{NumGPUBlocks: 256, BlockSize: 16}, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := newRunner(eng, NewTimingModel(nil, 1000, 0, 1))
			flushes := 0
			r.flush = func() {
				if flushes++; flushes == 6 {
					time.Sleep(tc.stall)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); r.run(ctx) }()
			for id := range uint64(2) {
				st := newStream(8)
				r.submit(command{kind: cmdAdd, id: id + 1, prompt: make([]int32, 40), max: 8, st: st})
				for !st.since(0, nil, nil).finished {
					<-st.notify
				}
				time.Sleep(idle) // far longer than maxLag
			}
			cancel()
			<-done
			if got := time.Duration(r.lag.Load()); got < tc.min || got > tc.max {
				t.Errorf("lag %v, want within [%v, %v]", got, tc.min, tc.max)
			}
		})
	}
}
