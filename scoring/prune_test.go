package scoring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// pruneCase is one random fleet and the scheduler options it is routed
// with; build replays it from the seed alone.
type pruneCase struct {
	seed    uint64
	workers int
}

// randomPruneOptions draws a cost model, its weights and the temperature.
func randomPruneOptions(g *rand.Rand, clock *fakeClock) Options {
	o := testOptions(clock, 1)
	o.Mode = ModeKV
	if g.IntN(5) == 0 {
		o.Mode = ModeKVWithoutEvents
	}
	o.CostModel = []string{CostLatency, CostDefault, CostWeighted}[g.IntN(3)]
	weight := func(def float64) float64 {
		switch g.IntN(4) {
		case 0:
			return 0
		case 1:
			return g.Float64() * 3
		}
		return def
	}
	o.DuplicatePrefillWeight = weight(o.DuplicatePrefillWeight)
	o.DecodeSlowdownWeight = weight(o.DecodeSlowdownWeight)
	o.CacheChurnWeight = weight(o.CacheChurnWeight)
	o.DecodeActiveRequestWeight = weight(o.DecodeActiveRequestWeight)
	o.HostCacheHitWeight = g.Float64()
	o.DiskCacheHitWeight = g.Float64() / 2
	o.OverlapCredit = weight(1)
	o.PrefillLoadScale = weight(1)
	o.WeightedA, o.WeightedB, o.WeightedC = weight(1), weight(1), weight(1)
	o.NoTrackPrefillTokens = g.IntN(6) == 0
	o.NoPrefillDecay = g.IntN(6) == 0
	if g.IntN(4) == 0 {
		o.PendingTTL = 0
	}
	if g.IntN(3) == 0 {
		o.PrefillContextCost = 0
	}
	if g.IntN(3) == 0 {
		o.Temperature = []float64{0.1, 0.5, 2}[g.IntN(3)]
	}
	return o
}

// buildPruneFleet returns a scheduler over a random fleet in a random
// state: requests in prefill and decoding, some sharing the probe's
// prefix (pending on their worker), fresh, stale and idle load reports,
// learned prefill rates, ejected, cooling and silent workers.
func buildPruneFleet(t testing.TB, pc pruneCase) (*Scheduler, *fakeClock, *rand.Rand, []uint64) {
	t.Helper()
	g := rand.New(rand.NewPCG(pc.seed, 7))
	clock := newFakeClock()
	o := randomPruneOptions(g, clock)
	r, err := NewScheduler(o)
	if err != nil {
		t.Fatal(err)
	}
	p := r.Pool()
	// A few shapes of worker, so that idle workers tie.
	for i := range pc.workers {
		s := spec(fmt.Sprintf("w%04d", i))
		if g.IntN(8) == 0 {
			s.BlockSize = 32
		}
		if g.IntN(6) == 0 {
			s.KVTotalBlocks = 50 + g.IntN(200)
		}
		if g.IntN(10) == 0 {
			s.MaxNumBatchedTokens = 0
		}
		if err := p.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	probe := hashes(42, 48, 0, 0)
	busy := g.Float64() // share of workers with requests
	// A dense fleet has a request in prefill on every worker, so that an
	// admission threshold can find them all saturated.
	dense := g.IntN(4) == 0
	if dense {
		busy = 1
	}
	n := 0
	for i := range pc.workers {
		id := fmt.Sprintf("w%04d", i)
		if g.Float64() >= busy {
			continue
		}
		for j := range 1 + g.IntN(4) {
			n++
			req := &Request{ID: fmt.Sprint("bg", n), Model: "m", PromptTokens: 64 + g.IntN(1500),
				ExpectedOutputTokens: g.IntN(300), Hashes: hashes(uint64(g.IntN(6)), g.IntN(48), g.IntN(8), n)}
			if g.IntN(5) == 0 {
				req.Hashes = probe[:1+g.IntN(len(probe))]
			}
			if err := p.Add(req, id, g.IntN(4)); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Duration(g.IntN(30)) * time.Millisecond)
			if dense && j == 0 {
				continue
			}
			switch g.IntN(5) {
			case 0:
				p.PrefillDone(req.ID)
			case 1:
				p.PrefillDone(req.ID)
				p.Progress(req.ID, g.IntN(200))
			case 2:
				p.Free(req.ID)
			case 3:
				p.Progress(req.ID, g.IntN(200))
				p.Free(req.ID)
			}
		}
	}
	for i := range pc.workers {
		id := fmt.Sprintf("w%04d", i)
		switch g.IntN(10) {
		case 0, 1, 2:
			idle := g.IntN(3) == 0
			rep := fleet.LoadReport{Running: g.IntN(6), Waiting: g.IntN(4), KVUsedBlocks: g.IntN(900), KVTotalBlocks: 1000}
			if idle {
				rep.Running, rep.Waiting = 0, 0
			}
			if err := p.SetLoadReport(id, rep); err != nil {
				t.Fatal(err)
			}
		case 3:
			p.ObserveFailure(id, "test")
			p.ObserveFailure(id, "test")
		case 4:
			p.ObserveLocalReply(id)
		}
	}
	// Engines store blocks: the eviction forecast counts them against the
	// places the freed requests' prompts took in the free queue.
	for i := range pc.workers {
		if g.IntN(3) == 0 {
			p.BlocksStored(fmt.Sprintf("w%04d", i), hashes(uint64(100+i), 0, g.IntN(300), i))
		}
	}
	// Everything ages: reports go stale for some, backlogs drain, cooling
	// and ejections may end.
	clock.Advance(time.Duration(g.IntN(3000)) * time.Millisecond)
	for i := range pc.workers {
		if g.IntN(12) == 0 {
			_ = p.SetLoadReport(fmt.Sprintf("w%04d", i), fleet.LoadReport{Waiting: g.IntN(3), KVTotalBlocks: 1000})
		}
	}
	return r, clock, g, probe
}

// randomCandidates takes the pool's candidates, a random subset of them
// now and then, with random overlap: mostly none, some holders, ties in
// cached blocks, host and disk blocks, stale views, an unknown worker.
func randomCandidates(g *rand.Rand, p *Pool, probeLen int) []Candidate {
	cs := p.AppendCandidates(nil, "m")
	if g.IntN(4) == 0 {
		keep := cs[:0]
		for _, c := range cs {
			if g.IntN(3) > 0 {
				keep = append(keep, c)
			}
		}
		cs = keep
	}
	holders := g.Float64() * g.Float64()
	for i := range cs {
		c := &cs[i]
		c.CachedBlocks = g.IntN(3) * 100
		if g.Float64() < holders {
			c.MatchedBlocks = g.IntN(probeLen + 1)
			if g.IntN(8) == 0 {
				c.HostBlocks, c.DiskBlocks = g.IntN(8), g.IntN(8)
			}
		}
		c.Stale = g.IntN(30) == 0
	}
	if g.IntN(10) == 0 {
		cs = append(cs, Candidate{Worker: "gone"})
	}
	return cs
}

// checkPruned routes one probe through the full decision and through
// decidePruned, each with its own copy of the same random source, and
// fails unless they agree on the decision and on the draws they took.
func checkPruned(t *testing.T, r *Scheduler, g *rand.Rand, probe []uint64, name string) (Decision, bool) {
	t.Helper()
	return checkPrunedWith(t, r, g, probe, name, nil)
}

// checkPrunedWith is checkPruned with the given candidates (overlap and
// all) when cands is not nil.
func checkPrunedWith(t *testing.T, r *Scheduler, g *rand.Rand, probe []uint64, name string, cands []Candidate) (Decision, bool) {
	t.Helper()
	opts := r.Options()
	if cands == nil {
		cands = randomCandidates(g, r.Pool(), len(probe))
	}
	req := &Request{ID: "probe", Model: "m", PromptTokens: 16*len(probe) - g.IntN(16), Hashes: probe,
		ExpectedOutputTokens: g.IntN(500)}
	if g.IntN(8) == 0 {
		req.PromptTokens = 0 // body mode NONE: load alone
	}
	threshold := 0.0
	if g.IntN(4) == 0 {
		threshold = []float64{0.01, 0.5, 1, 4}[g.IntN(4)]
	}
	seed := g.Uint64()
	full, pruned := opts, opts
	randFull, randPruned := rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 1))
	full.Rand, pruned.Rand = randFull, randPruned
	src := OverlapEvents
	if opts.Mode == ModeKVWithoutEvents {
		src = OverlapApprox
	}
	kvFull, kvPruned := newKV(full.withDefaults(), src), newKV(pruned.withDefaults(), src)
	pending := opts.PendingTTL > 0 && src == OverlapEvents

	for _, l := range r.pool.appendLoads(nil, req, cands, pending) {
		if l.ForecastLostBlocks > 0 {
			prunedForecasts.Add(1)
		}
	}
	dFull, satFull, errFull := r.decideFull(req, cands, nil, threshold, false, kvFull, pending)
	var dPruned Decision
	var satPruned bool
	var errPruned error
	if kvPruned.prunable(nil) {
		dPruned, satPruned, errPruned = r.pool.decidePruned(req, cands, pending, kvPruned, threshold)
	} else {
		dPruned, satPruned, errPruned = r.decideFull(req, cands, nil, threshold, false, kvPruned, pending)
	}
	if (errFull == nil) != (errPruned == nil) || satFull != satPruned || dFull != dPruned {
		t.Fatalf("%s: %d candidates, cost %s, T=%g, threshold %g:\nfull   %+v sat=%v err=%v\npruned %+v sat=%v err=%v",
			name, len(cands), opts.CostModel, opts.Temperature, threshold, dFull, satFull, errFull, dPruned, satPruned, errPruned)
	}
	if a, b := randFull.Uint64(), randPruned.Uint64(); a != b {
		t.Fatalf("%s: the pruned decision drew differently from the full one (cost %s)", name, opts.CostModel)
	}
	return dFull, errFull == nil && !satFull
}

// TestPrunedPickIsTheFullPick compares decidePruned with the full decision
// over random fleets of 1 to 1,500 workers, every cost model, temperature 0
// and above, admission thresholds and health states; each fleet routes a
// series of probes, committing each decision so that the pending overlay
// and the load move between them.
func TestPrunedPickIsTheFullPick(t *testing.T) {
	iterations := 400
	if testing.Short() {
		iterations = 60
	}
	for it := range iterations {
		g := rand.New(rand.NewPCG(uint64(it), 99))
		workers := 1 + g.IntN(64)
		switch g.IntN(8) {
		case 0:
			workers = 1 + g.IntN(1500)
		case 1, 2:
			workers = 32 + g.IntN(400)
		}
		pc := pruneCase{seed: uint64(it), workers: workers}
		r, clock, g2, probe := buildPruneFleet(t, pc)
		for step := range 12 {
			name := fmt.Sprintf("fleet %d (%d workers) probe %d", it, workers, step)
			d, ok := checkPruned(t, r, g2, probe, name)
			if ok && g2.IntN(2) == 0 {
				req := &Request{ID: fmt.Sprint("p", step), Model: "m", PromptTokens: 16 * len(probe), Hashes: probe}
				if err := r.pool.addLocal(req, d.Worker, d.MatchedBlocks, d.MatchedBlocks-d.PendingBlocks); err != nil {
					t.Fatal(err)
				}
			}
			clock.Advance(time.Duration(g2.IntN(200)) * time.Millisecond)
		}
	}
	if prunedForecasts.Load() == 0 {
		t.Error("no candidate of any fleet had a matched prefix the eviction forecast took blocks off: the comparison did not cover it")
	}
}

// prunedForecasts counts the candidates of checkPruned's probes whose
// overlap the eviction forecast cut.
var prunedForecasts atomic.Int64

// FuzzPrunedPick is TestPrunedPickIsTheFullPick driven by the fuzzer: a
// fleet of 1 to 1,500 workers from a seed, four probes, each after a
// random change to the fleet (mutateFleet), which the worker summaries
// must carry into the decision.
func FuzzPrunedPick(f *testing.F) {
	f.Add(uint64(1), uint16(40))
	f.Add(uint64(7), uint16(1000))
	f.Fuzz(func(t *testing.T, seed uint64, workers uint16) {
		pc := pruneCase{seed: seed, workers: 1 + int(workers)%1500}
		r, clock, g, probe := buildPruneFleet(t, pc)
		for step := range 4 {
			op := mutateFleet(t, r, g, probe, clock)
			d, ok := checkPruned(t, r, g, probe, fmt.Sprintf("seed %d, %d workers, probe %d after %s", seed, pc.workers, step, op))
			if ok {
				req := &Request{ID: fmt.Sprint("p", step), Model: "m", PromptTokens: 16 * len(probe), Hashes: probe}
				if err := r.pool.addLocal(req, d.Worker, d.MatchedBlocks, d.MatchedBlocks-d.PendingBlocks); err != nil {
					t.Fatal(err)
				}
			}
			clock.Advance(time.Duration(g.IntN(200)) * time.Millisecond)
		}
	})
}

// TestPrunedPickTies pins the tie-break on an idle fleet, where every
// candidate but the holders costs the same: the pruned decision draws
// among the tied workers exactly as the full one does, decision after
// decision.
func TestPrunedPickTies(t *testing.T) {
	for _, cost := range []string{CostLatency, CostDefault, CostWeighted} {
		clock := newFakeClock()
		o := testOptions(clock, 3)
		o.CostModel = cost
		r := newTestScheduler(t, o, 300)
		g := rand.New(rand.NewPCG(5, 5))
		for step := range 50 {
			cs := r.Pool().AppendCandidates(nil, "m")
			for i := range cs {
				cs[i].CachedBlocks = 100 * (i % 2)
			}
			req := &Request{ID: fmt.Sprint("t", step), Model: "m", PromptTokens: 256, Hashes: hashes(9, 16, 0, 0)}
			seed := g.Uint64()
			full, pruned := o, o
			randFull, randPruned := rand.New(rand.NewPCG(seed, 2)), rand.New(rand.NewPCG(seed, 2))
			full.Rand, pruned.Rand = randFull, randPruned
			kvFull, kvPruned := newKV(full.withDefaults(), OverlapEvents), newKV(pruned.withDefaults(), OverlapEvents)
			dFull, _, err := r.decideFull(req, cs, nil, 0, false, kvFull, false)
			if err != nil {
				t.Fatal(err)
			}
			dPruned, _, err := r.pool.decidePruned(req, cs, false, kvPruned, 0)
			if err != nil {
				t.Fatal(err)
			}
			if dFull != dPruned || randFull.Uint64() != randPruned.Uint64() {
				t.Fatalf("%s step %d: full %s, pruned %s", cost, step, dFull.Worker, dPruned.Worker)
			}
		}
	}
}

// TestPricingWithoutBacklogIsALowerBound checks the two properties that
// let decidePruned pass over a candidate without its full price: each cost
// model's logit never falls when the backlog grows, and never falls below
// the parts' floor whatever the view, to the bit, on the random fleets'
// candidates.
func TestPricingWithoutBacklogIsALowerBound(t *testing.T) {
	for it := range 150 {
		g := rand.New(rand.NewPCG(uint64(it), 3))
		r, _, g2, probe := buildPruneFleet(t, pruneCase{seed: uint64(it) + 1000, workers: 1 + g.IntN(200)})
		opts := r.Options()
		kv := newKV(opts, OverlapEvents)
		cands := randomCandidates(g2, r.Pool(), len(probe))
		req := &Request{ID: "probe", Model: "m", PromptTokens: 16*len(probe) - g.IntN(16), Hashes: probe,
			ExpectedOutputTokens: g.IntN(500)}
		loads := r.pool.appendLoads(nil, req, cands, opts.PendingTTL > 0)
		var s fleetStats
		for i := range loads {
			s.add(req, &loads[i])
		}
		v := kv.cost.view(s)
		for i := range loads {
			l := loads[i]
			var full, bare loadParts
			kv.cost.parts(req, &l, &full)
			l.PrefillBacklog, l.PrefillBacklogAttention = 0, 0 // what the first pass sees
			kv.cost.parts(req, &l, &bare)
			if lb, logit := kv.cost.finish(&bare, v), kv.cost.finish(&full, v); lb > logit {
				t.Fatalf("fleet %d, %s, %s: %v without the backlog, above %v with it", it, opts.CostModel, l.ID, lb, logit)
			}
			for _, view := range []fleetView{v, {}, {held: 1 << 20, meanChurn: 1e-3, maxWaiting: 1}} {
				if logit := kv.cost.finish(&bare, view); bare.floor > logit {
					t.Fatalf("fleet %d, %s, %s: floor %v above the logit %v (view %+v)", it, opts.CostModel, l.ID, bare.floor, logit, view)
				}
			}
		}
	}
}

// TestPartsThenFinishIsTheLogit holds each cost model's two-step price
// (parts, then finish: decidePruned's) to its one-step logit (the full
// decision's), to the bit, over the random fleets' candidates and views
// near and far from theirs.
func TestPartsThenFinishIsTheLogit(t *testing.T) {
	for it := range 200 {
		g := rand.New(rand.NewPCG(uint64(it), 11))
		r, _, g2, probe := buildPruneFleet(t, pruneCase{seed: uint64(it) + 5000, workers: 1 + g.IntN(120)})
		opts := r.Options()
		kv := newKV(opts, OverlapEvents)
		cands := randomCandidates(g2, r.Pool(), len(probe))
		req := &Request{ID: "probe", Model: "m", PromptTokens: 16*len(probe) - g.IntN(16), Hashes: probe,
			ExpectedOutputTokens: g.IntN(500)}
		loads := r.pool.appendLoads(nil, req, cands, opts.PendingTTL > 0)
		var s fleetStats
		for i := range loads {
			s.add(req, &loads[i])
		}
		v := kv.cost.view(s)
		views := []fleetView{v, {}, {held: v.held + 1 + g.IntN(4096), meanChurn: v.meanChurn * g.Float64(), maxWaiting: v.maxWaiting + g.IntN(3)}}
		for i := range loads {
			var p loadParts
			kv.cost.parts(req, &loads[i], &p)
			for _, view := range views {
				if a, b := kv.cost.finish(&p, view), kv.cost.logit(req, &loads[i], view); math.Float64bits(a) != math.Float64bits(b) {
					t.Fatalf("fleet %d, %s, %s, view %+v: parts then finish %v, logit %v", it, opts.CostModel, loads[i].ID, view, a, b)
				}
			}
		}
	}
}

// TestPrunedPickUnderConcurrentLoad routes from several goroutines through
// Scheduler.Pick on a fleet large enough to prune while others add and
// free requests, for the race detector: the pruned decision reads the
// pool under its read lock and keeps its scratch to itself.
func TestPrunedPickUnderConcurrentLoad(t *testing.T) {
	seeded := DefaultOptions()
	seeded.Rand = rand.New(rand.NewPCG(1, 2)) // shared by the pickers under a lock
	for _, o := range []Options{DefaultOptions(), seeded} {
		pickUnderConcurrentLoad(t, o)
	}
}

func pickUnderConcurrentLoad(t *testing.T, o Options) {
	r := newTestScheduler(t, o, pruneAt+72)
	cs := r.Pool().AppendCandidates(nil, "m")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				req := &Request{ID: fmt.Sprintf("g%d-%d", g, i), Model: "m", PromptTokens: 512, Hashes: hashes(uint64(i%3), 24, 8, i)}
				d, err := r.Pick(req, cs, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if g%2 == 0 {
					if err := r.Pool().Add(req, d.Worker, 0); err != nil {
						t.Error(err)
						return
					}
					r.Pool().PrefillDone(req.ID)
					r.Pool().Free(req.ID)
				}
			}
		}()
	}
	wg.Wait()
}
