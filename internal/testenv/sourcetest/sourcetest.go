// Package sourcetest checks a discovery.Source against the contract every
// source keeps, on a real backend (embedded etcd, a temporary file, a real
// kube-apiserver): synced with the workers present at start, later
// additions, changes and removals reach the Sink, a bad record is reported
// through the Observer and changes nothing, and Run ends with its context.
package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
)

// Backend is one source's world as the contract drives it.
type Backend interface {
	// Open returns a fresh Source over the backend, not yet run.
	Open(t *testing.T) discovery.Source
	// Put makes a worker appear in the backend, or changes it.
	Put(t *testing.T, w fleet.Worker)
	// Delete takes a worker out of the backend.
	Delete(t *testing.T, id string)
	// PutBad writes something the source must refuse (a value that is not
	// a record, a file that does not parse, a pod with a bad annotation).
	PutBad(t *testing.T)
}

// Worker is the record the contract uses for id: what every source can
// express (a pod carries its model and block size in annotations).
func Worker(id string, ip byte, blockSize int) fleet.Worker {
	return fleet.Worker{ID: id, Model: "m", Address: fmt.Sprintf("10.0.0.%d:8000", ip), BlockSize: blockSize}
}

// Run checks the contract: one table of steps, applied in order to one
// backend, each followed by the fleet the Sink must then hold.
func Run(t *testing.T, b Backend) {
	b.Put(t, Worker("a", 1, 16))
	b.Put(t, Worker("b", 2, 16))
	src := b.Open(t)
	if g := src.FlapGrace(); g < 0 {
		t.Errorf("FlapGrace() = %v, want >= 0", g)
	}
	sink, obs := NewSink(), &Observer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink, obs) }()
	defer func() { // Run must not outlive the backend the test cleans up
		cancel()
		select {
		case err := <-done:
			_ = err // the step that ends the context checks Run's error
		case <-time.After(30 * time.Second):
		}
	}()

	steps := []struct {
		name string
		do   func(t *testing.T)
		want []fleet.Worker
		bad  bool // a bad record is reported
	}{
		{"synced holds the workers present at start", func(t *testing.T) {
			if !discovery.WaitSynced(ctx, src, 30*time.Second) {
				t.Fatal("not synced after 30 s")
			}
		}, []fleet.Worker{Worker("a", 1, 16), Worker("b", 2, 16)}, false},
		{"a new worker reaches the sink", func(t *testing.T) { b.Put(t, Worker("c", 3, 16)) },
			[]fleet.Worker{Worker("a", 1, 16), Worker("b", 2, 16), Worker("c", 3, 16)}, false},
		{"a changed worker is upserted", func(t *testing.T) { b.Put(t, Worker("a", 1, 32)) },
			[]fleet.Worker{Worker("a", 1, 32), Worker("b", 2, 16), Worker("c", 3, 16)}, false},
		{"a removed worker leaves the sink", func(t *testing.T) { b.Delete(t, "b") },
			[]fleet.Worker{Worker("a", 1, 32), Worker("c", 3, 16)}, false},
		{"a bad record is reported and changes nothing", b.PutBad,
			[]fleet.Worker{Worker("a", 1, 32), Worker("c", 3, 16)}, true},
	}
	for _, st := range steps {
		if !t.Run(st.name, func(t *testing.T) {
			before := obs.Bad()
			st.do(t)
			if st.bad {
				Eventually(t, "the bad record reported", func() bool { return obs.Bad() > before })
			}
			Eventually(t, fmt.Sprintf("the sink holding %s", ids(st.want)), func() bool { return sink.Holds(st.want) })
			if !st.bad && obs.Bad() != before {
				t.Errorf("%d bad records reported for good ones", obs.Bad()-before)
			}
		}) {
			return
		}
	}
	t.Run("Run ends with its context", func(t *testing.T) {
		cancel()
		select {
		case err := <-done:
			done <- err // for the deferred wait
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run still running 30 s after its context ended")
		}
	})
}

func ids(ws []fleet.Worker) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

// Sink is a fleet.Sink that keeps the current fleet.
type Sink struct {
	mu      sync.Mutex
	workers map[string]fleet.Worker
}

// NewSink returns an empty Sink.
func NewSink() *Sink { return &Sink{workers: map[string]fleet.Worker{}} }

// Upsert implements fleet.Sink.
func (s *Sink) Upsert(w fleet.Worker) { s.mu.Lock(); s.workers[w.ID] = w; s.mu.Unlock() }

// Remove implements fleet.Sink.
func (s *Sink) Remove(id string) { s.mu.Lock(); delete(s.workers, id); s.mu.Unlock() }

// Get returns a worker's record.
func (s *Sink) Get(id string) (fleet.Worker, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.workers[id]
	return w, ok
}

// IDs returns the workers held, sorted.
func (s *Sink) IDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.workers))
}

// Holds reports whether the sink holds exactly want: the same ids, each
// with the same model, address and block size.
func (s *Sink) Holds(want []fleet.Worker) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.workers) != len(want) {
		return false
	}
	for _, w := range want {
		got, ok := s.workers[w.ID]
		if !ok || got.Model != w.Model || got.Address != w.Address || got.BlockSize != w.BlockSize {
			return false
		}
	}
	return true
}

// Observer is a discovery.Observer that counts bad records and keeps the
// last reachability it heard.
type Observer struct {
	mu   sync.Mutex
	bad  int
	down error
}

// BadRecord implements discovery.Observer.
func (o *Observer) BadRecord(string, error) { o.mu.Lock(); o.bad++; o.mu.Unlock() }

// Health implements discovery.Observer.
func (o *Observer) Health(err error) { o.mu.Lock(); o.down = err; o.mu.Unlock() }

// Bad counts the bad records reported.
func (o *Observer) Bad() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bad
}

// Down returns the last outage reported, nil when none or it ended.
func (o *Observer) Down() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.down
}

// Eventually polls cond until it holds, failing t after 30 s.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
