package scoring

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// firstTokenMetrics counts Metrics.FirstToken by signal.
type firstTokenMetrics struct {
	NopMetrics
	mu      sync.Mutex
	signals map[string]int
}

func (m *firstTokenMetrics) FirstToken(signal string) {
	m.mu.Lock()
	if m.signals == nil {
		m.signals = map[string]int{}
	}
	m.signals[signal]++
	m.mu.Unlock()
}

func (m *firstTokenMetrics) count(signal string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.signals[signal]
}

// firstTokenSetup is a pool of w0 and w1 (block size 16) whose events
// have shown they store blocks (unless quiet), a fake clock, and the
// prefill-done events the pool tells peers.
type firstTokenSetup struct {
	clock   *fakeClock
	p       *Pool
	metrics *firstTokenMetrics
	mu      sync.Mutex
	done    []string // OpPrefillDone IDs sent to peers
}

func newFirstTokenSetup(t *testing.T, quiet bool) *firstTokenSetup {
	t.Helper()
	s := &firstTokenSetup{clock: newFakeClock(), metrics: &firstTokenMetrics{}}
	o := testOptions(s.clock, 1)
	o.Metrics = s.metrics
	s.p = NewPool(o)
	for _, id := range []string{"w0", "w1"} {
		if err := s.p.Upsert(spec(id)); err != nil {
			t.Fatal(err)
		}
		if !quiet {
			s.p.BlocksStored(id, []uint64{1 << 60}) // an earlier request's block
		}
	}
	s.p.SetSink(func(ev fleet.SyncEvent) {
		if ev.Op == fleet.OpPrefillDone {
			s.mu.Lock()
			s.done = append(s.done, ev.ID)
			s.mu.Unlock()
		}
	})
	return s
}

// add routes request id with a prompt of n full blocks (plus 5 tokens) to
// worker, whose index held its first indexed blocks.
func (s *firstTokenSetup) add(t *testing.T, id, worker string, hs []uint64, indexed int) {
	t.Helper()
	if err := s.p.Add(&Request{ID: id, Model: "m", PromptTokens: len(hs)*16 + 5, Hashes: hs}, worker, indexed); err != nil {
		t.Fatal(err)
	}
}

func (s *firstTokenSetup) inPrefill(t *testing.T, worker string) int {
	t.Helper()
	return mustLoad(t, s.p, worker).PrefillRequests
}

func (s *firstTokenSetup) samples(t *testing.T, worker string) int {
	t.Helper()
	return mustLoad(t, s.p, worker).FitSamples
}

func (s *firstTokenSetup) told() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.done...)
}

// The worker's BlockStored for the prompt's last full block ends the
// prefill, timed: the rate fit learns from it and peers hear of it. The
// response headers before it change nothing.
func TestKVEventEndsPrefillAtThePromptsLastBlock(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	hs := hashes(3, 0, 8, 1)
	s.add(t, "a", "w0", hs, 0)
	s.clock.Advance(100 * time.Millisecond)
	s.p.ResponseStarted("a") // a streamed answer's headers, before its first token
	s.p.BlocksStored("w0", hs[:7])
	if got := s.inPrefill(t, "w0"); got != 1 {
		t.Fatalf("after the headers and 7 of 8 blocks: %d requests in prefill, want 1", got)
	}
	s.clock.Advance(400 * time.Millisecond)
	before := s.samples(t, "w0")
	s.p.BlocksStored("w1", hs[7:]) // another worker's block: not a's
	if got := s.inPrefill(t, "w0"); got != 1 {
		t.Fatalf("after w1 stored the block: %d requests in prefill on w0, want 1", got)
	}
	s.p.BlocksStored("w0", hs[7:])
	if got := s.inPrefill(t, "w0"); got != 0 {
		t.Fatalf("after the last block: %d requests in prefill, want 0", got)
	}
	if got := s.samples(t, "w0"); got != before+1 {
		t.Errorf("fit samples %d, want %d: the event times the first token", got, before+1)
	}
	if got := s.told(); len(got) != 1 || got[0] != "a" {
		t.Errorf("peers told of prefill done for %v, want [a]", got)
	}
	if got := s.metrics.count(FirstTokenKVEvent); got != 1 {
		t.Errorf("%d kv_event first tokens, want 1", got)
	}
	// The first chunk after it changes nothing more.
	s.p.PrefillDone("a")
	if got := s.samples(t, "w0"); got != before+1 {
		t.Errorf("fit samples %d after the first chunk, want %d", got, before+1)
	}
	s.p.Free("a")
	if n := len(s.p.workers["w0"].awaiting); n != 0 {
		t.Errorf("%d blocks still awaited", n)
	}
}

// Without a block to wait for, the response headers end the prefill,
// untimed (they are no first token), and the first body chunk ends it timed.
func TestPrefillWithoutABlockToAwait(t *testing.T) {
	tests := []struct {
		name     string
		quiet    bool // the worker never reported a stored block
		blocks   int
		indexed  int
		headers  bool // ResponseStarted, else PrefillDone (first chunk)
		learns   bool
		signal   string
		awaiting int
	}{
		{name: "prompt shorter than a block, headers", blocks: 0, headers: true, signal: FirstTokenResponseHeaders},
		{name: "last block indexed already, headers", blocks: 6, indexed: 6, headers: true, signal: FirstTokenResponseHeaders},
		{name: "worker publishes no stored blocks, headers", quiet: true, blocks: 6, headers: true, signal: FirstTokenResponseHeaders},
		{name: "last block indexed already, first chunk", blocks: 6, indexed: 6, learns: true, signal: FirstTokenResponse},
		{name: "new last block, first chunk before the event", blocks: 6, indexed: 2, learns: true, signal: FirstTokenResponse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFirstTokenSetup(t, tt.quiet)
			s.add(t, "a", "w0", hashes(5, 0, tt.blocks, 1), tt.indexed)
			s.clock.Advance(50 * time.Millisecond)
			before := s.samples(t, "w0")
			if tt.headers {
				s.p.ResponseStarted("a")
			} else {
				s.p.PrefillDone("a")
			}
			if got := s.inPrefill(t, "w0"); got != 0 {
				t.Fatalf("%d requests in prefill, want 0", got)
			}
			if learned := s.samples(t, "w0") > before; learned != tt.learns {
				t.Errorf("rate fit learned: %v, want %v", learned, tt.learns)
			}
			if got := s.metrics.count(tt.signal); got != 1 {
				t.Errorf("%d first tokens by %s, want 1", got, tt.signal)
			}
			if n := len(s.p.workers["w0"].awaiting); n != 0 {
				t.Errorf("%d blocks still awaited after the prefill ended", n)
			}
		})
	}
}

// A gap in the worker's events ends the wait: a request whose response
// started ends its prefill then (untimed); one whose response has not
// started waits for it.
func TestEventGapEndsTheWait(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	s.add(t, "started", "w0", hashes(5, 0, 4, 1), 0)
	s.add(t, "waiting", "w0", hashes(5, 0, 4, 2), 0)
	s.p.ResponseStarted("started")
	before := s.samples(t, "w0")
	s.p.CacheReset("w0")
	if got := s.inPrefill(t, "w0"); got != 1 {
		t.Fatalf("after the gap: %d requests in prefill, want 1 (the one without a response yet)", got)
	}
	if got := s.metrics.count(FirstTokenEventGap); got != 1 {
		t.Errorf("%d event_gap first tokens, want 1", got)
	}
	s.p.ResponseStarted("waiting")
	if got := s.inPrefill(t, "w0"); got != 0 {
		t.Fatalf("after its headers: %d requests in prefill, want 0", got)
	}
	if got := s.samples(t, "w0"); got != before {
		t.Errorf("fit samples %d, want %d: neither end was timed", got, before)
	}
}

// Requests waiting for the same block all end with it; one freed before
// leaves the others waiting, and a lost event leaves the request to its
// stream's end.
func TestRequestsSharingTheLastBlock(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	hs := hashes(9, 0, 5, 1)
	for _, id := range []string{"a", "b", "c"} {
		s.add(t, id, "w0", hs, 0)
	}
	s.p.Free("b")
	if got := s.inPrefill(t, "w0"); got != 2 {
		t.Fatalf("%d in prefill after freeing b, want 2", got)
	}
	s.p.BlocksStored("w0", hs[4:])
	if got := s.inPrefill(t, "w0"); got != 0 {
		t.Fatalf("%d in prefill after the block, want 0", got)
	}
	if got := s.metrics.count(FirstTokenKVEvent); got != 2 {
		t.Errorf("%d kv_event first tokens, want 2", got)
	}
	s.add(t, "lost", "w0", hashes(9, 0, 5, 2), 0)
	s.p.Free("lost")
	if got := len(s.p.workers["w0"].awaiting); got != 0 {
		t.Errorf("%d blocks still awaited after every request ended", got)
	}
}

// A request moved to another worker waits for its block there.
func TestMovedRequestAwaitsItsNewWorker(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	hs := hashes(11, 0, 3, 1)
	s.add(t, "a", "w0", hs, 0)
	if err := s.p.Move("a", "w1"); err != nil {
		t.Fatal(err)
	}
	s.p.BlocksStored("w0", hs)
	if got := s.inPrefill(t, "w1"); got != 1 {
		t.Fatalf("w0's event ended a request that moved to w1")
	}
	s.p.BlocksStored("w1", hs)
	if got := s.inPrefill(t, "w1"); got != 0 {
		t.Fatalf("w1's event did not end the moved request's prefill")
	}
}

// Peers' requests are theirs to end: no wait here.
func TestPeersRequestsAwaitNoBlock(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	hs := hashes(13, 0, 3, 1)
	if err := s.p.Apply(fleet.SyncEvent{Router: "peer", Op: fleet.OpAdd, ID: "x", Worker: "w0", PromptTokens: 53, PrefillTokens: 53, Hashes: hs}); err != nil {
		t.Fatal(err)
	}
	s.p.BlocksStored("w0", hs)
	if got := s.inPrefill(t, "w0"); got != 1 {
		t.Fatalf("%d in prefill, want the peer's request still in it", got)
	}
}

// The event path costs no allocation while requests wait for other blocks.
func TestBlocksStoredAllocatesNothing(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	for i := range 16 {
		s.add(t, fmt.Sprint(i), "w0", hashes(17, 0, 4, i), 0)
	}
	stored := hashes(19, 0, 8, 99)
	if n := testing.AllocsPerRun(100, func() { s.p.BlocksStored("w0", stored) }); n != 0 {
		t.Errorf("BlocksStored: %v allocs, want 0", n)
	}
}

// Events, lifecycle calls and picks race on the pool (go test -race).
func TestFirstTokenUnderConcurrency(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				id := fmt.Sprintf("%d-%d", g, i)
				hs := hashes(21, 2, 3, g*1000+i)
				s.add(t, id, "w0", hs, 0)
				switch i % 3 {
				case 0:
					s.p.BlocksStored("w0", hs)
				case 1:
					s.p.ResponseStarted(id)
					s.p.CacheReset("w0")
				}
				s.p.Free(id)
			}
		}()
	}
	wg.Wait()
	if got := s.inPrefill(t, "w0"); got != 0 {
		t.Errorf("%d in prefill after every request ended", got)
	}
	if n := len(s.p.workers["w0"].awaiting); n != 0 {
		t.Errorf("%d blocks still awaited", n)
	}
}

// The KV index holds its lock while it tells BlocksStored, and a woken
// admission queue picks, which takes that lock: the pool wakes the queue
// in AfterApply, with the lock released, once per batch that ended a
// prefill.
func TestKVEventWakesTheQueueAfterTheApply(t *testing.T) {
	s := newFirstTokenSetup(t, false)
	var kicks int
	s.p.setCapacityListener(func() { kicks++ })
	hs := hashes(23, 0, 2, 1)
	s.add(t, "a", "w0", hs, 0)
	s.p.BlocksStored("w0", hs)
	if kicks != 0 {
		t.Fatalf("BlocksStored woke the queue %d times under the index's lock", kicks)
	}
	s.p.AfterApply()
	s.p.AfterApply()
	if kicks != 1 {
		t.Errorf("AfterApply woke the queue %d times, want 1", kicks)
	}
	s.p.BlocksStored("w0", hs)
	s.p.AfterApply()
	if kicks != 1 {
		t.Errorf("a batch that ended no prefill woke the queue")
	}
}
