package scoring

import (
	"context"
	"sync"
	"testing"
	"time"
)

// SetMode swaps the mode over the same pool: load admitted before the
// switch stays counted, the next pick uses the new mode, and a bad name
// keeps the mode in use.
func TestSetModeSwitchesInPlaceKeepingTheLoad(t *testing.T) {
	r := newTestScheduler(t, testOptions(newFakeClock(), 1), 2)
	if _, err := r.Route(t.Context(), &Request{ID: "a", Model: "m", PromptTokens: 640, Hashes: hashes(1, 40, 0, 0)}, cands(0, 0), nil); err != nil {
		t.Fatal(err)
	}
	before := mustLoad(t, r.Pool(), "w0").ActiveBlocks + mustLoad(t, r.Pool(), "w1").ActiveBlocks
	tests := []struct {
		name, mode, want string
		wantErr          bool
	}{
		{"to round robin", "round_robin", ModeRoundRobin, false},
		{"dashes are underscores", "least-loaded", ModeLeastLoaded, false},
		{"unknown keeps the mode", "nope", ModeLeastLoaded, true},
		{"back to kv", "kv", ModeKV, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := r.SetMode(tt.mode); (err != nil) != tt.wantErr {
				t.Fatalf("SetMode(%q) = %v, want error %v", tt.mode, err, tt.wantErr)
			}
			if got := r.Mode().Name(); got != tt.want {
				t.Fatalf("mode %q, want %q", got, tt.want)
			}
			after := mustLoad(t, r.Pool(), "w0").ActiveBlocks + mustLoad(t, r.Pool(), "w1").ActiveBlocks
			if after != before {
				t.Fatalf("active blocks %d after the switch, want %d", after, before)
			}
		})
	}
	if got := r.Options().Mode; got != "kv" {
		t.Errorf("Options().Mode = %q, want the mode in use", got)
	}
}

// A request waiting in the admission queue across a switch is admitted
// when capacity frees, by the new mode.
func TestSetModeKeepsQueuedRequests(t *testing.T) {
	o := testOptions(newFakeClock(), 1)
	o.QueueThreshold = 0.5
	r := newTestScheduler(t, o, 1)
	if _, err := r.Route(t.Context(), &Request{ID: "big", Model: "m", PromptTokens: 1024}, cands(0), nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var err error
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = r.Route(ctx, &Request{ID: "waiter", Model: "m", PromptTokens: 64}, cands(0), nil)
	}()
	waitFor(t, func() bool { return r.QueueLen() == 1 }, "the request to queue")
	if err := r.SetMode("least_loaded"); err != nil {
		t.Fatal(err)
	}
	r.Pool().Free("big")
	wg.Wait()
	if err != nil {
		t.Fatalf("queued request after the switch: %v", err)
	}
	if !r.Pool().Active("waiter") {
		t.Fatal("the queued request was not admitted")
	}
}
