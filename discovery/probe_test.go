package discovery

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// healthLog is an Observer that keeps the Health calls.
type healthLog struct {
	mu  sync.Mutex
	ups []bool
}

func (*healthLog) BadRecord(string, error) {}
func (l *healthLog) Health(err error) {
	l.mu.Lock()
	l.ups = append(l.ups, err == nil)
	l.mu.Unlock()
}

func (l *healthLog) got() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ups)
}

// Only changes are reported, and the first report is an outage: a
// healthy start is not news.
func TestReachabilityReportsChangesOnly(t *testing.T) {
	away := errors.New("away")
	var l healthLog
	h := NewReachability(&l)
	for _, err := range []error{nil, nil, away, away, nil, nil, away, nil} {
		h.Set(err)
	}
	if got, want := l.got(), []bool{false, true, false, true}; !slices.Equal(got, want) {
		t.Errorf("Health calls (up?) = %v, want %v", got, want)
	}
}

// Probe sets the reachability from each check and stops with its context.
func TestProbeReportsEachCheck(t *testing.T) {
	answers := []error{errors.New("refused"), errors.New("refused"), nil}
	calls := make(chan struct{}, 16)
	var l healthLog
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		i := 0
		Probe(ctx, NewReachability(&l), time.Millisecond, time.Second, func(context.Context) error {
			calls <- struct{}{}
			err := answers[min(i, len(answers)-1)]
			i++
			return err
		})
	}()
	for range len(answers) + 1 { // one more call: the third answer has been set
		<-calls
	}
	cancel()
	<-done
	if got, want := l.got(), []bool{false, true}; !slices.Equal(got, want) {
		t.Errorf("Health calls (up?) = %v, want %v", got, want)
	}
}
