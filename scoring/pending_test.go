package scoring

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// pendingSetup is two workers, w0 and w1, and request "a" routed to one of
// them (home) with a 40-block prompt nobody had cached; the clock then
// moves on far enough for home's backlog to drain, but not past the TTL.
type pendingSetup struct {
	clock      *fakeClock
	r          *Scheduler
	hs         []uint64
	home, away string
}

const pendingBlocksOfA = 40

func newPendingSetup(t *testing.T, change func(*Options)) *pendingSetup {
	t.Helper()
	clock := newFakeClock()
	o := testOptions(clock, 1)
	if change != nil {
		change(&o)
	}
	s := &pendingSetup{clock: clock, r: newTestScheduler(t, o, 2), hs: hashes(7, pendingBlocksOfA, 0, 0)}
	d := s.route(t, "a", s.hs, cands(0, 0))
	s.home, s.away = d.Worker, "w1"
	if s.home == "w1" {
		s.away = "w0"
	}
	clock.Advance(200 * time.Millisecond)
	return s
}

func (s *pendingSetup) route(t *testing.T, id string, hs []uint64, cs []Candidate) Decision {
	t.Helper()
	d, err := s.r.Route(t.Context(), &Request{ID: id, Model: "m", PromptTokens: len(hs)*16 + 5, Hashes: hs}, cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// pendingTerm picks (without committing) for a request with a's prompt
// and returns the pending blocks the decision credited on worker.
func (s *pendingSetup) pendingTerm(t *testing.T, worker string, cs []Candidate) int {
	t.Helper()
	exp := &Explanation{}
	if _, err := s.r.Pick(&Request{ID: "probe", Model: "m", PromptTokens: len(s.hs)*16 + 5, Hashes: s.hs}, cs, exp); err != nil {
		t.Fatal(err)
	}
	for _, w := range exp.Workers {
		if w.Worker == worker {
			return w.PendingBlocks
		}
	}
	t.Fatalf("%s not in the explanation", worker)
	return 0
}

// A request for a prompt routed a moment ago follows it: the blocks the
// router sent count as overlap before any KV event says so.
func TestPendingOverlayDrawsTheNextRequestOfAPrompt(t *testing.T) {
	s := newPendingSetup(t, nil)
	d := s.route(t, "b", s.hs, cands(0, 0))
	if d.Worker != s.home || d.PendingBlocks != pendingBlocksOfA || d.MatchedBlocks != pendingBlocksOfA {
		t.Fatalf("second request: %+v; want %s with %d pending blocks", d, s.home, pendingBlocksOfA)
	}

	off := newPendingSetup(t, func(o *Options) { o.PendingTTL = 0 })
	if d := off.route(t, "b", off.hs, cands(0, 0)); d.PendingBlocks != 0 || d.MatchedBlocks != 0 {
		t.Fatalf("with the overlay off the second request saw %d pending blocks", d.PendingBlocks)
	}
	if n := off.r.Pool().PendingBlocks(off.home); n != 0 {
		t.Fatalf("with the overlay off %d blocks were recorded", n)
	}
}

func TestPendingEntriesEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, s *pendingSetup)
		// want is the pending credit on home for a's prompt afterwards,
		// with home's candidate matching indexed blocks.
		want, indexed int
		// ejected: the worker is out of the pick, so only its entries are checked.
		ejected bool
	}{
		{name: "they last until something ends them", want: pendingBlocksOfA},
		{name: "the worker's events report them stored", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().BlocksStored(s.home, s.hs)
		}},
		{name: "events report a prefix stored: the index matches it, the rest stays pending", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().BlocksStored(s.home, s.hs[:10])
		}, indexed: 10, want: pendingBlocksOfA - 10},
		{name: "events for another worker change nothing", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().BlocksStored(s.away, s.hs)
			s.r.Pool().BlocksStored("unknown", s.hs)
		}, want: pendingBlocksOfA},
		{name: "the TTL passes", do: func(t *testing.T, s *pendingSetup) {
			s.clock.Advance(DefaultPendingTTL)
		}},
		{name: "the request is freed before its first token", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().Free("a")
		}},
		{name: "the request is freed after its first token: the events are still to come", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().PrefillDone("a")
			s.r.Pool().Free("a")
		}, want: pendingBlocksOfA},
		{name: "a request freed before its first token leaves what another active request holds", do: func(t *testing.T, s *pendingSetup) {
			if err := s.r.Pool().Add(&Request{ID: "b", Model: "m", PromptTokens: 20*16 + 5, Hashes: s.hs[:20]}, s.home, 0); err != nil {
				t.Fatal(err)
			}
			s.r.Pool().Free("a")
		}, want: 20},
		{name: "the worker is ejected", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().PrefillDone("a") // so that freeing it on ejection takes nothing back
			s.r.Pool().Observe(s.home, false)
			s.r.Pool().Observe(s.home, false)
			if _, ejected := s.r.Pool().Ejected(s.home); !ejected {
				t.Fatal("two failures did not eject the worker")
			}
			if n := s.r.Pool().PendingBlocks(s.home); n != 0 {
				t.Errorf("%d blocks still pending on the ejected worker", n)
			}
		}, ejected: true},
		{name: "the worker is removed and comes back", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().Remove(s.home)
			if err := s.r.Pool().Upsert(spec(s.home)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "the index resets the worker's view", do: func(t *testing.T, s *pendingSetup) {
			s.r.Pool().CacheReset(s.home)
		}},
		{name: "the request moves to another worker", do: func(t *testing.T, s *pendingSetup) {
			if err := s.r.Pool().Move("a", s.away); err != nil {
				t.Fatal(err)
			}
			if n := s.r.Pool().PendingBlocks(s.away); n != pendingBlocksOfA {
				t.Errorf("%d blocks pending where the request moved, want %d", n, pendingBlocksOfA)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPendingSetup(t, nil)
			if tc.do != nil {
				tc.do(t, s)
			}
			cs := cands(0, 0)
			for i := range cs {
				if cs[i].Worker == s.home {
					cs[i].MatchedBlocks = tc.indexed
				}
			}
			if tc.ejected {
				return
			}
			if got := s.pendingTerm(t, s.home, cs); got != tc.want {
				t.Errorf("pending credit on %s: %d blocks, want %d", s.home, got, tc.want)
			}
			s.r.Pool().Sweep()
			if tc.want == 0 && tc.indexed == 0 {
				if n := s.r.Pool().PendingBlocks(s.home); n != 0 {
					t.Errorf("%d pending entries left on %s after a sweep, want none", n, s.home)
				}
			}
		})
	}
}

// Only the kv mode reads the event-fed index: the approximate index
// already records decisions, and load modes ignore overlap.
func TestPendingOverlayCountsOnlyForTheEventMode(t *testing.T) {
	for _, mode := range []string{ModeKVWithoutEvents, ModeRoundRobin, ModeLeastLoaded} {
		s := newPendingSetup(t, nil)
		if err := s.r.SetMode(mode); err != nil {
			t.Fatal(err)
		}
		d := s.route(t, "b", s.hs, cands(0, 0))
		if d.PendingBlocks != 0 {
			t.Errorf("%s credited %d pending blocks", mode, d.PendingBlocks)
		}
	}
}

func TestPendingOverlayGivesAStaleWorkerNoCredit(t *testing.T) {
	s := newPendingSetup(t, nil)
	cs := cands(0, 0)
	for i := range cs {
		cs[i].Stale = cs[i].Worker == s.home
	}
	if got := s.pendingTerm(t, s.home, cs); got != 0 {
		t.Fatalf("a stale worker got %d pending blocks of credit", got)
	}
}

func TestPendingOverlayRecordsPeersAdds(t *testing.T) {
	s := newPendingSetup(t, nil)
	peer := hashes(9, 12, 0, 0)
	if err := s.r.Pool().Apply(fleet.SyncEvent{Router: "r2", Op: fleet.OpAdd, ID: "x", Worker: s.away, PromptTokens: 12*16 + 5, Hashes: peer}); err != nil {
		t.Fatal(err)
	}
	if n := s.r.Pool().PendingBlocks(s.away); n != len(peer) {
		t.Fatalf("a peer's request left %d pending blocks, want %d", n, len(peer))
	}
	if err := s.r.Pool().Apply(fleet.SyncEvent{Router: "r2", Op: fleet.OpFree, ID: "x"}); err != nil {
		t.Fatal(err)
	}
	if n := s.r.Pool().PendingBlocks(s.away); n != 0 {
		t.Fatalf("the peer's request freed before its first token left %d pending blocks", n)
	}
}

// At the cap the oldest records go first; a prompt longer than the cap
// keeps its leading blocks, since only a prefix counts.
func TestPendingOverlayCap(t *testing.T) {
	const limit = 8
	s := newPendingSetup(t, func(o *Options) { o.PendingMaxBlocks = limit })
	p := s.r.Pool()
	if n := p.PendingBlocks(s.home); n != limit {
		t.Fatalf("%d blocks pending, want the cap %d", n, limit)
	}
	if got := s.pendingTerm(t, s.home, cands(0, 0)); got != limit {
		t.Fatalf("pending credit %d, want the first %d blocks", got, limit)
	}
	other := hashes(8, 6, 0, 0)
	if err := p.Add(&Request{ID: "c", Model: "m", PromptTokens: 6*16 + 5, Hashes: other}, s.home, 0); err != nil {
		t.Fatal(err)
	}
	if n := p.PendingBlocks(s.home); n != limit {
		t.Fatalf("%d blocks pending after more records, want the cap %d", n, limit)
	}
	if got := s.pendingTerm(t, s.home, cands(0, 0)); got != 0 {
		t.Fatalf("a's oldest blocks should have gone first, yet %d of its blocks count", got)
	}
}

func TestPendingBlocksRenewAndStayBounded(t *testing.T) {
	var pb pendingBlocks
	const ttl = int64(time.Second)
	hs := []uint64{1, 2, 3}
	pb.record(hs, 0, ttl, 100)
	pb.record(hs[:1], ttl/2, ttl/2+ttl, 100) // block 1 renewed
	pb.expire(ttl)
	if pb.len() != 1 || pb.run(hs, 0, ttl) != 1 {
		t.Fatalf("after the first deadline: %d entries, run %d; want the renewed block only", pb.len(), pb.run(hs, 0, ttl))
	}
	pb.expire(ttl/2 + ttl)
	if pb.len() != 0 || len(pb.fifo) != 0 {
		t.Fatalf("after every deadline: %d entries, %d records", pb.len(), len(pb.fifo))
	}
	// Renewing one block forever keeps the records within the cap.
	for i := range int64(10_000) {
		pb.record(hs[:1], i, i+ttl, 16)
		if live := len(pb.fifo) - pb.head; live > 16 {
			t.Fatalf("%d live records, cap 16", live)
		}
	}
	if cap(pb.fifo) > 256 {
		t.Fatalf("the record fifo grew to %d slots for a cap of 16", cap(pb.fifo))
	}
}

func TestAddPendingMovesOffloadedBlocksOnDevice(t *testing.T) {
	for _, tc := range []struct {
		pending, host, disk    int
		wantHost, wantDisk     int
		wantMatched, wantPendN int
	}{
		{pending: 0, host: 3, disk: 2, wantHost: 3, wantDisk: 2, wantMatched: 5},
		{pending: 2, host: 3, disk: 2, wantHost: 1, wantDisk: 2, wantMatched: 7, wantPendN: 2},
		{pending: 4, host: 3, disk: 2, wantHost: 0, wantDisk: 1, wantMatched: 9, wantPendN: 4},
		{pending: 9, host: 3, disk: 2, wantHost: 0, wantDisk: 0, wantMatched: 14, wantPendN: 9},
	} {
		l := Load{MatchedBlocks: 5, HostBlocks: tc.host, DiskBlocks: tc.disk}
		l.addPending(tc.pending)
		if l.HostBlocks != tc.wantHost || l.DiskBlocks != tc.wantDisk || l.MatchedBlocks != tc.wantMatched || l.PendingBlocks != tc.wantPendN {
			t.Errorf("%d pending over host %d disk %d: %+v", tc.pending, tc.host, tc.disk, l)
		}
	}
}

func TestExplanationShowsPendingApartFromIndexed(t *testing.T) {
	s := newPendingSetup(t, nil)
	cs := cands(0, 0)
	for i := range cs {
		if cs[i].Worker == s.home {
			cs[i].MatchedBlocks = 10
		}
	}
	exp := &Explanation{}
	if _, err := s.r.Pick(&Request{ID: "p", Model: "m", PromptTokens: len(s.hs)*16 + 5, Hashes: s.hs}, cs, exp); err != nil {
		t.Fatal(err)
	}
	for i, w := range exp.Workers {
		if w.Worker != s.home {
			continue
		}
		if w.MatchedBlocks != 10 || w.PendingBlocks != pendingBlocksOfA-10 {
			t.Fatalf("terms: matched %d pending %d; want 10 and %d", w.MatchedBlocks, w.PendingBlocks, pendingBlocksOfA-10)
		}
		if line := exp.Line(i); !strings.Contains(line, "matched_blocks=10 pending_blocks=30") {
			t.Fatalf("log line lacks the two terms: %s", line)
		}
		return
	}
	t.Fatal("home worker not explained")
}

// Decisions, lifecycle calls, events and sweeps race (run with -race);
// once every request is freed and every block reported stored, nothing is
// pending anywhere.
func TestPendingOverlayUnderConcurrency(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.PendingMaxBlocks = 64
	r := newTestScheduler(t, o, 4)
	prompts := make([][]uint64, 6)
	for i := range prompts {
		prompts[i] = hashes(uint64(i+1), 30, 0, 0)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 200 {
				id := fmt.Sprintf("g%d-%d", g, i)
				hs := prompts[rng.IntN(len(prompts))]
				d, err := r.Route(t.Context(), &Request{ID: id, Model: "m", PromptTokens: len(hs) * 16, Hashes: hs}, cands(0, 0, 0, 0), nil)
				if err != nil {
					t.Error(err)
					return
				}
				if rng.IntN(2) == 0 {
					r.Pool().PrefillDone(id)
				}
				if rng.IntN(3) == 0 {
					r.Pool().BlocksStored(d.Worker, hs[:rng.IntN(len(hs))])
				}
				r.Pool().Free(id)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 300 {
			clock.Advance(time.Millisecond)
			r.Pool().Sweep()
			if i%50 == 0 {
				r.Pool().CacheReset(fmt.Sprint("w", i%4))
			}
		}
	}()
	wg.Wait()
	for i := range 4 {
		w := fmt.Sprint("w", i)
		if l := mustLoad(t, r.Pool(), w); l.ActiveRequests != 0 || l.ActiveBlocks != 0 {
			t.Errorf("%s: %d requests, %d blocks left", w, l.ActiveRequests, l.ActiveBlocks)
		}
		if n := r.Pool().PendingBlocks(w); n > o.PendingMaxBlocks {
			t.Errorf("%s: %d pending entries past the cap %d", w, n, o.PendingMaxBlocks)
		}
		for _, hs := range prompts {
			r.Pool().BlocksStored(w, hs)
		}
		if n := r.Pool().PendingBlocks(w); n != 0 {
			t.Errorf("%s: %d pending entries after every block was reported stored", w, n)
		}
	}
}

func TestPendingRunJumpsOnlyOverIntactRecords(t *testing.T) {
	const ttl = int64(time.Second)
	seq := func(from, to uint64) []uint64 {
		var out []uint64
		for h := from; h <= to; h++ {
			out = append(out, h)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		build  func(pb *pendingBlocks)
		prompt []uint64
		from   int
		now    int64
		want   int
	}{
		{"a whole record", func(pb *pendingBlocks) { pb.record(seq(1, 10), 0, ttl, 100) }, seq(1, 10), 0, 0, 10},
		{"from inside the record", func(pb *pendingBlocks) { pb.record(seq(1, 10), 0, ttl, 100) }, seq(1, 10), 4, 0, 6},
		{"a prompt longer than the record", func(pb *pendingBlocks) { pb.record(seq(1, 10), 0, ttl, 100) }, seq(1, 14), 0, 0, 10},
		{"a prompt that leaves the record", func(pb *pendingBlocks) { pb.record(seq(1, 10), 0, ttl, 100) },
			append(seq(1, 5), 99, 100, 101, 102, 103), 0, 0, 5},
		{"the record's end reported stored", func(pb *pendingBlocks) {
			pb.record(seq(1, 10), 0, ttl, 100)
			pb.forget([]uint64{10})
		}, seq(1, 10), 0, 0, 9},
		{"a hole before the end is found block by block", func(pb *pendingBlocks) {
			pb.record(seq(1, 10), 0, ttl, 100)
			pb.forget([]uint64{4, 10})
		}, seq(1, 10), 0, 0, 3},
		{"a renewed prefix and the older rest", func(pb *pendingBlocks) {
			pb.record(seq(1, 10), 0, ttl, 100)
			pb.record(seq(1, 5), ttl/2, ttl/2+ttl, 100)
		}, seq(1, 10), 0, ttl / 4, 10},
		{"past the older record's deadline only the renewed prefix", func(pb *pendingBlocks) {
			pb.record(seq(1, 10), 0, ttl, 100)
			pb.record(seq(1, 5), ttl/2, ttl/2+ttl, 100)
		}, seq(1, 10), 0, ttl, 5},
		{"expired", func(pb *pendingBlocks) { pb.record(seq(1, 10), 0, ttl, 100) }, seq(1, 10), 0, ttl, 0},
		{"nothing recorded", func(*pendingBlocks) {}, seq(1, 10), 0, 0, 0},
		{"from past the prompt", func(pb *pendingBlocks) { pb.record(seq(1, 10), 0, ttl, 100) }, seq(1, 10), 12, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pb pendingBlocks
			tc.build(&pb)
			if got := pb.run(tc.prompt, tc.from, tc.now); got != tc.want {
				t.Fatalf("run = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestPendingForgetSkipsOnlyWhatWasNeverPending drives the overlay with
// random records, expiries, forgets and resets, and after each forget
// compares its entries with a copy of the map that deleted every
// forgotten hash without asking the filter first.
func TestPendingForgetSkipsOnlyWhatWasNeverPending(t *testing.T) {
	const ttl = int64(time.Second)
	g := rand.New(rand.NewPCG(3, 9))
	var pb pendingBlocks
	now := int64(0)
	randomHashes := func(space uint64) []uint64 {
		hs := make([]uint64, g.IntN(40))
		for i := range hs {
			hs[i] = g.Uint64N(space) * 0x100000001b3 // spread over the filter's bits, often colliding
		}
		return hs
	}
	for step := range 5000 {
		space := []uint64{20, 300, 1 << 40}[step%3]
		switch now += int64(g.IntN(int(ttl / 8))); g.IntN(8) {
		case 0:
			pb.expire(now)
		case 1:
			if g.IntN(50) == 0 {
				pb.reset()
			}
		case 2, 3, 4:
			pb.record(randomHashes(space), now, now+ttl, 256)
		default:
			hs := randomHashes(space)
			want := pendingEntries(&pb)
			for _, h := range hs {
				delete(want, h)
			}
			pb.forget(hs)
			if got := pendingEntries(&pb); !maps.Equal(got, want) {
				t.Fatalf("step %d: forget left %d entries, want %d", step, len(got), len(want))
			}
			if pb.len() != len(want) {
				t.Fatalf("step %d: len %d, want %d", step, pb.len(), len(want))
			}
		}
	}
}

// pendingEntries is a copy of pb's entries.
func pendingEntries(pb *pendingBlocks) map[uint64]pendingEntry {
	m := map[uint64]pendingEntry{}
	if pb.hasZero {
		m[0] = pb.zeroEntry
	}
	for _, s := range pb.until.slots {
		if s.hash != 0 {
			m[s.hash] = s.v
		}
	}
	return m
}
