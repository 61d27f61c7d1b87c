package scoring

import (
	"sync"
	"testing"
	"time"
)

// Reconfigure swaps the mode, the cost weights and the queue's limits at
// once, keeps everything else, and refuses what needs a new Scheduler.
func TestReconfigureAppliesRoutingOptionsOnly(t *testing.T) {
	o := testOptions(newFakeClock(), 1)
	o.QueueThreshold = 2
	r := newTestScheduler(t, o, 2)
	before := r.Options()

	next := before
	next.Mode = ModeRoundRobin
	next.DecodeActiveRequestWeight = 3
	next.QueueMaxLength = 7
	next.QueueMaxWait = time.Second
	next.PrefillRate = 1 // a pool prior: not reloadable, ignored
	if err := r.Reconfigure(next); err != nil {
		t.Fatal(err)
	}
	got := r.Options()
	if got.Mode != ModeRoundRobin || r.Mode().Name() != ModeRoundRobin {
		t.Errorf("mode %q (%q), want round_robin", got.Mode, r.Mode().Name())
	}
	if got.DecodeActiveRequestWeight != 3 || got.QueueMaxLength != 7 || got.QueueMaxWait != time.Second {
		t.Errorf("options after reconfigure: %+v", got)
	}
	if got.PrefillRate != before.PrefillRate {
		t.Errorf("prefill rate %g changed by reconfigure, want %g kept", got.PrefillRate, before.PrefillRate)
	}
	// A later mode switch keeps the reloaded weights.
	if err := r.SetMode(ModeKV); err != nil {
		t.Fatal(err)
	}
	if w := r.Options().DecodeActiveRequestWeight; w != 3 {
		t.Errorf("weight %g after SetMode, want 3", w)
	}

	refused := []struct {
		name string
		edit func(*Options)
	}{
		{"invalid weight", func(o *Options) { o.WeightedA = -1 }},
		{"unknown mode", func(o *Options) { o.Mode = "nope" }},
		{"queue off", func(o *Options) { o.QueueThreshold = 0 }},
		{"queue policy", func(o *Options) { o.QueuePolicy = "lcfs" }},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			keep := r.Options()
			next := keep
			tt.edit(&next)
			if err := r.Reconfigure(next); err == nil {
				t.Fatal("Reconfigure accepted it")
			}
			if now := r.Options(); now.Mode != keep.Mode || now.WeightedA != keep.WeightedA || now.QueueThreshold != keep.QueueThreshold {
				t.Errorf("options changed by a refused reconfigure: %+v", now)
			}
		})
	}
}

// Picks racing with reconfigures see one whole configuration each (run
// with -race).
func TestReconfigureConcurrentWithPicks(t *testing.T) {
	r := newTestScheduler(t, testOptions(newFakeClock(), 1), 4)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			o := r.Options()
			o.DecodeActiveRequestWeight = float64(i % 10)
			if err := r.Reconfigure(o); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < 2000; i++ {
		if _, err := r.Pick(&Request{ID: "x", Model: "m", PromptTokens: 64, Hashes: hashes(1, 4, 0, 0)}, cands(0, 1, 2, 3), nil); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
