package scoring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// checkSummaries fails unless every worker's summaries are what its
// fields say now, and each model's array is in candidate order.
func checkSummaries(t testing.TB, p *Pool, when string) {
	t.Helper()
	p.mu.RLock()
	defer p.mu.RUnlock()
	for name, ws := range p.models {
		arr := p.sums[name]
		if len(arr) != len(ws) {
			t.Fatalf("%s: model %q: %d summaries for %d workers", when, name, len(arr), len(ws))
		}
		for i, w := range ws {
			if !slices.Contains(w.sums, &arr[i]) {
				t.Fatalf("%s: model %q: %s does not own summary %d", when, name, w.spec.ID, i)
			}
			if got, want := arr[i], p.summaryOfLocked(w); got != want {
				t.Fatalf("%s: %s's summary is stale:\nheld %+v\nnow  %+v", when, w.spec.ID, got, want)
			}
		}
	}
}

// mutateFleet changes the load or state of a random worker or request
// through one of the pool's calls, as traffic does between decisions.
func mutateFleet(t testing.TB, r *Scheduler, g *rand.Rand, probe []uint64, clock *fakeClock) string {
	t.Helper()
	p := r.Pool()
	p.mu.RLock()
	ids := make([]string, 0, len(p.reqs))
	for id := range p.reqs {
		ids = append(ids, id)
	}
	workers := make([]string, 0, len(p.workers))
	for id := range p.workers {
		workers = append(workers, id)
	}
	p.mu.RUnlock()
	slices.Sort(ids)
	slices.Sort(workers)
	if len(workers) == 0 {
		return "nothing"
	}
	w := workers[g.IntN(len(workers))]
	req := ""
	if len(ids) > 0 {
		req = ids[g.IntN(len(ids))]
	}
	switch op := g.IntN(13); {
	case op == 0 && req != "":
		p.PrefillDone(req)
		return "PrefillDone"
	case op == 1 && req != "":
		p.Progress(req, g.IntN(400))
		return "Progress"
	case op == 2 && req != "":
		p.Free(req)
		return "Free"
	case op == 3 && req != "":
		if err := p.Move(req, w); err != nil {
			t.Fatal(err)
		}
		return "Move"
	case op == 4 && req != "":
		p.ResponseStarted(req)
		return "ResponseStarted"
	case op == 5:
		rep := fleet.LoadReport{Running: g.IntN(3), Waiting: g.IntN(3), KVUsedBlocks: g.IntN(900), KVTotalBlocks: 1000}
		if err := p.SetLoadReport(w, rep); err != nil {
			t.Fatal(err)
		}
		return "SetLoadReport"
	case op == 6:
		p.ObserveFailure(w, "test")
		p.ObserveFailure(w, "test")
		return "ObserveFailure"
	case op == 7:
		p.ObserveLocalReply(w)
		return "ObserveLocalReply"
	case op == 8:
		p.BlocksStored(w, probe[:g.IntN(len(probe)+1)])
		return "BlocksStored"
	case op == 9:
		p.CacheReset(w)
		return "CacheReset"
	case op == 12:
		p.BlocksRemoved(w, probe[g.IntN(4):])
		return "BlocksRemoved"
	case op == 10:
		clock.Advance(time.Duration(g.IntN(3000)) * time.Millisecond)
		p.Sweep()
		return "Sweep"
	case op == 11 && g.IntN(2) == 0:
		s, _ := p.Spec(w)
		s.KVTotalBlocks = 50 + g.IntN(2000)
		s.MaxNumBatchedTokens = g.IntN(3) * 1024
		if err := p.Upsert(s); err != nil {
			t.Fatal(err)
		}
		return "Upsert"
	default:
		n := g.IntN(1 << 20)
		a := &Request{ID: fmt.Sprint("m", n), Model: "m", PromptTokens: 64 + g.IntN(1500), Hashes: hashes(uint64(g.IntN(6)), g.IntN(48), g.IntN(8), n)}
		if g.IntN(3) == 0 {
			a.Hashes = probe[:1+g.IntN(len(probe))]
		}
		if err := p.Add(a, w, g.IntN(4)); err != nil {
			t.Fatal(err)
		}
		return "Add"
	}
}

// TestSummariesAreCurrent drives random fleets through every call that
// changes a worker and checks after each that the summaries the pruned
// decision reads say what the workers say.
func TestSummariesAreCurrent(t *testing.T) {
	for it := range 40 {
		r, clock, g, probe := buildPruneFleet(t, pruneCase{seed: uint64(it) + 9000, workers: 1 + it*7})
		checkSummaries(t, r.Pool(), "after building")
		for step := range 200 {
			op := mutateFleet(t, r, g, probe, clock)
			checkSummaries(t, r.Pool(), fmt.Sprintf("fleet %d step %d (%s)", it, step, op))
			clock.Advance(time.Duration(g.IntN(50)) * time.Millisecond)
		}
	}
}

// TestPrunedPickFollowsEveryChange routes through both decisions after
// each of a series of random changes to a fleet large enough to prune:
// the summaries must carry every change into the next decision. Now and
// then the candidates are ones gathered before a worker joined or left.
func TestPrunedPickFollowsEveryChange(t *testing.T) {
	iterations := 30
	if testing.Short() {
		iterations = 6
	}
	for it := range iterations {
		g := rand.New(rand.NewPCG(uint64(it), 17))
		r, clock, g2, probe := buildPruneFleet(t, pruneCase{seed: uint64(it) + 7000, workers: pruneAt + g.IntN(400)})
		var old []Candidate
		for step := range 40 {
			op := mutateFleet(t, r, g2, probe, clock)
			name := fmt.Sprintf("fleet %d step %d after %s", it, step, op)
			var cands []Candidate
			switch g.IntN(10) {
			case 0:
				old = r.Pool().AppendCandidates(nil, "m")
				if err := r.Pool().Upsert(spec(fmt.Sprintf("x%04d", step))); err != nil {
					t.Fatal(err)
				}
			case 1:
				old = r.Pool().AppendCandidates(nil, "m")
				r.Pool().Remove(old[g.IntN(len(old))].Worker)
			case 2:
				cands = old
			}
			checkPrunedWith(t, r, g2, probe, name, cands)
			clock.Advance(time.Duration(g2.IntN(100)) * time.Millisecond)
		}
	}
}
