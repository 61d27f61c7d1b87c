package scoring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/fleet"
)

func cands(matched ...int) []Candidate {
	out := make([]Candidate, len(matched))
	for i, m := range matched {
		out[i] = Candidate{Worker: fmt.Sprintf("w%d", i), MatchedBlocks: m}
	}
	return out
}

// Behaviour 1: with equal load, the worker with the longest overlap wins.
func TestLongestOverlapWinsUnderEqualLoad(t *testing.T) {
	tests := []struct {
		name    string
		matched []int
		want    string
	}{
		{"one cached", []int{0, 10, 0, 0}, "w1"},
		{"longest of several", []int{3, 10, 7, 9}, "w1"},
		{"last", []int{0, 1, 2, 30}, "w3"},
		{"one block more", []int{20, 21, 20}, "w1"},
	}
	for _, tt := range tests {
		for _, model := range []string{CostDefault, CostWeighted} {
			t.Run(tt.name+"/"+model, func(t *testing.T) {
				o := testOptions(newFakeClock(), 1)
				o.CostModel = model
				r := newTestScheduler(t, o, len(tt.matched))
				// Equal load everywhere.
				for i := range tt.matched {
					req := &Request{ID: fmt.Sprint("bg", i), PromptTokens: 320, Hashes: hashes(uint64(i+50), 20, 0, 0)}
					if err := r.Pool().Add(req, fmt.Sprintf("w%d", i), 0); err != nil {
						t.Fatal(err)
					}
				}
				d, err := r.Pick(&Request{ID: "r", PromptTokens: 512}, cands(tt.matched...), nil)
				if err != nil {
					t.Fatal(err)
				}
				if d.Worker != tt.want {
					t.Errorf("picked %s, want %s", d.Worker, tt.want)
				}
			})
		}
	}
}

// Behaviour 2: with equal overlap, the least-loaded worker wins.
func TestLeastLoadedWinsUnderEqualOverlap(t *testing.T) {
	tests := []struct {
		name string
		// load is each worker's background prompt tokens (0 = idle).
		load []int
		// prefillDone marks background requests whose prefill finished, so
		// only their decode blocks count.
		prefillDone bool
		want        string
	}{
		{"idle one among busy", []int{320, 0, 320}, false, "w1"},
		{"lightest", []int{640, 480, 160, 320}, false, "w2"},
		{"decode only", []int{640, 480, 160, 320}, true, "w2"},
	}
	for _, tt := range tests {
		for _, model := range []string{CostDefault, CostWeighted} {
			t.Run(tt.name+"/"+model, func(t *testing.T) {
				o := testOptions(newFakeClock(), 1)
				o.CostModel = model
				r := newTestScheduler(t, o, len(tt.load))
				for i, n := range tt.load {
					if n == 0 {
						continue
					}
					id := fmt.Sprint("bg", i)
					req := &Request{ID: id, PromptTokens: n, Hashes: hashes(uint64(i+50), n/16, 0, 0)}
					if err := r.Pool().Add(req, fmt.Sprintf("w%d", i), 0); err != nil {
						t.Fatal(err)
					}
					if tt.prefillDone {
						r.Pool().PrefillDone(id)
					}
				}
				matched := make([]int, len(tt.load))
				for i := range matched {
					matched[i] = 5
				}
				d, err := r.Pick(&Request{ID: "r", PromptTokens: 256}, cands(matched...), nil)
				if err != nil {
					t.Fatal(err)
				}
				if d.Worker != tt.want {
					t.Errorf("picked %s, want %s", d.Worker, tt.want)
				}
			})
		}
	}
}

func TestDefaultCostTerms(t *testing.T) {
	tests := []struct {
		name           string
		noTrack        bool
		weight         float64
		prompt, output int
		matched        int
		load           Load
		wantPrefill    float64
		wantDecode     float64
	}{
		{"idle, nothing cached", false, 1, 160, 0, 0, Load{}, 10, 10},
		{"half cached", false, 1, 160, 0, 5, Load{}, 5, 10},
		{"partial block", false, 1, 170, 0, 0, Load{}, 10.625, 11},
		{"prefill in flight tracked", false, 1, 160, 0, 0, Load{PrefillTokens: 320, PrefillBacklog: 320}, 30, 10},
		{"backlog drained", false, 1, 160, 0, 0, Load{PrefillTokens: 320, PrefillBacklog: 160}, 20, 10},
		{"prefill in flight untracked", true, 1, 160, 0, 0, Load{PrefillTokens: 320, PrefillBacklog: 320}, 10, 10},
		{"active blocks", false, 1, 160, 0, 10, Load{ActiveBlocks: 25}, 0, 35},
		{"expected output", false, 1, 160, 32, 0, Load{}, 10, 12},
		{"fresh report above own count", false, 1, 160, 0, 0, Load{ActiveBlocks: 5, ReportFresh: true, Report: fleet.LoadReport{KVUsedBlocks: 40}}, 10, 50},
		{"stale report", false, 1, 160, 0, 0, Load{ActiveBlocks: 5, Report: fleet.LoadReport{KVUsedBlocks: 40}}, 10, 15},
		{"overlap weight", false, 2.5, 160, 0, 0, Load{}, 10, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			o.NoTrackPrefillTokens = tt.noTrack
			o.OverlapWeight = tt.weight
			m := costOf[*dynamoCost](o, CostDefault)
			l := tt.load
			l.BlockSize, l.MatchedBlocks = 16, tt.matched
			got := m.termsOf(&Request{PromptTokens: tt.prompt, ExpectedOutputTokens: tt.output}, &l)
			if got.prefill != tt.wantPrefill || got.decode != tt.wantDecode {
				t.Errorf("terms = prefill %g decode %g, want %g %g", got.prefill, got.decode, tt.wantPrefill, tt.wantDecode)
			}
			if want := tt.weight*tt.wantPrefill + tt.wantDecode; got.logit != want {
				t.Errorf("logit = %g, want %g", got.logit, want)
			}
		})
	}
}

func TestWeightedCostTerms(t *testing.T) {
	o := DefaultOptions()
	o.CostModel = CostWeighted
	m := costOf[*weightedCost](o, CostWeighted)
	l := Load{BlockSize: 16, KVTotalBlocks: 1000, ActiveBlocks: 250, MatchedBlocks: 8,
		ReportFresh: true, Report: fleet.LoadReport{Waiting: 2}}
	got := m.termsOf(&Request{PromptTokens: 256}, &l, 4)
	if got.ratio != 0.5 || got.usage != 0.25 || got.waiting != 0.5 {
		t.Fatalf("terms = %+v, want ratio 0.5 usage 0.25 waiting 0.5", got)
	}
	if want := 2*0.5 - 0.25 - 0.5; math.Abs(got.score-want) > 1e-12 {
		t.Errorf("score = %g, want %g", got.score, want)
	}
}

func TestTiesGoToFewestCachedBlocksThenRandom(t *testing.T) {
	loads := func(cached ...int) []Load {
		out := make([]Load, len(cached))
		for i, c := range cached {
			out[i] = Load{ID: fmt.Sprint("w", i), logit: 10, CachedBlocks: c}
		}
		return out
	}
	r := &lockedRand{r: rand.New(rand.NewPCG(1, 2))}
	if got := selectLogit(loads(50, 20, 30), 0, r); got != 1 {
		t.Errorf("tie among cache sizes picked %d, want 1 (fewest cached)", got)
	}
	// Equal cache too: each of the tied workers wins about a third.
	counts := make([]int, 4)
	ls := loads(10, 5, 5, 5)
	for range 3000 {
		counts[selectLogit(ls, 0, r)]++
	}
	if counts[0] != 0 {
		t.Errorf("worker with more cache won %d ties", counts[0])
	}
	for i := 1; i < 4; i++ {
		if counts[i] < 850 || counts[i] > 1150 {
			t.Errorf("tied worker %d won %d of 3000, want about 1000", i, counts[i])
		}
	}
	// A strictly better logit beats fewer cached blocks.
	ls = loads(0, 100)
	ls[1].logit = 9
	if got := selectLogit(ls, 0, r); got != 1 {
		t.Errorf("picked %d, want the lower logit", got)
	}
}

// Behaviour 4: softmax sampling frequencies match the computed
// probabilities (chi-square, fixed seed).
func TestSoftmaxSamplingMatchesProbabilities(t *testing.T) {
	logits := []float64{100, 110, 125, 140, 200}
	for _, temp := range []float64{0.1, 0.5, 1, 4} {
		t.Run(fmt.Sprint("T=", temp), func(t *testing.T) {
			loads := make([]Load, len(logits))
			for i, l := range logits {
				loads[i] = Load{ID: fmt.Sprint("w", i), logit: l}
			}
			minL, rng := logitRange(loads)
			var sum float64
			probs := make([]float64, len(loads))
			for i := range loads {
				probs[i] = math.Exp(-(logits[i] - minL) / (rng * temp))
				sum += probs[i]
			}
			for i := range probs {
				probs[i] /= sum
			}
			const n = 40000
			r := &lockedRand{r: rand.New(rand.NewPCG(42, 7))}
			counts := make([]int, len(loads))
			for range n {
				counts[selectLogit(loads, temp, r)]++
			}
			var chi2 float64
			df := -1
			for i, p := range probs {
				exp := p * n
				if exp < 5 {
					// Too rare to test; it must still be rare.
					if counts[i] > 30 {
						t.Errorf("worker %d with p=%g drawn %d times", i, p, counts[i])
					}
					continue
				}
				chi2 += (float64(counts[i]) - exp) * (float64(counts[i]) - exp) / exp
				df++
			}
			// 99.9th percentile of chi-square for df ≤ 4 is at most 18.47.
			if chi2 > 18.47 {
				t.Errorf("chi-square %g with %d dof: counts %v, probabilities %v", chi2, df, counts, probs)
			}
		})
	}
}

func TestSoftmaxIsUniformWhenLogitsAreEqual(t *testing.T) {
	loads := []Load{{logit: 3}, {logit: 3}, {logit: 3}}
	r := &lockedRand{r: rand.New(rand.NewPCG(3, 4))}
	counts := make([]int, 3)
	for range 3000 {
		counts[selectLogit(loads, 1, r)]++
	}
	for i, c := range counts {
		if c < 880 || c > 1120 {
			t.Errorf("worker %d drawn %d of 3000, want about 1000", i, c)
		}
	}
}

// Behaviour 3: a flood of requests sharing one system prompt first goes to
// the worker that caches it, then spreads over the fleet once load
// outweighs the prefill saving — no hot spot.
func TestSharedPromptFloodSpreadsOverTheFleet(t *testing.T) {
	for _, tt := range []struct {
		name     string
		weight   float64
		lifetime int // requests finish this many arrivals later
		maxShare float64
		// minWorkers is how many workers must take part.
		minWorkers int
		// firstOnCached is how many leading requests must land on w0.
		firstOnCached int
	}{
		{"default weight", 1, 40, 0.15, floodWorkers, 1},
		// The latency cost warms only as many workers as the load needs:
		// a cold one costs a 1,024-token prefill, a warm one 64 tokens plus
		// the slowdown of its running decodes; no one worker takes it all.
		{"latency cost", 0, 40, 0.6, 2, 1},
		// Four times the prefill saving needs more live requests before the
		// load outweighs it; the cold workers' 64-block prefill then costs
		// more than sharing the warm ones, so only some workers warm up.
		{"overlap weight 4", 4, 160, 0.35, 4, 40},
	} {
		t.Run(tt.name, func(t *testing.T) {
			counts, order := runFlood(t, tt.weight, tt.lifetime)
			for i := range tt.firstOnCached {
				if order[i] != "w0" {
					t.Errorf("request %d went to %s, want the cached w0 (order %v)", i, order[i], order[:8])
				}
			}
			for w, c := range counts {
				if share := float64(c) / floodRequests; share > tt.maxShare {
					t.Errorf("%s took %.0f%% of the flood, want at most %.0f%% (counts %v)", w, 100*share, 100*tt.maxShare, counts)
				}
			}
			if len(counts) < tt.minWorkers {
				t.Errorf("only %d of %d workers used, want at least %d: %v", len(counts), floodWorkers, tt.minWorkers, counts)
			}
		})
	}
}

// The flood measurement does see a hot spot when the cost ignores load.
func TestFloodMeasurementDetectsAHotSpot(t *testing.T) {
	counts, _ := runFlood(t, 1000, 40)
	if counts["w0"] < floodRequests*9/10 {
		t.Errorf("overlap weight 1000 spread the flood %v; the measurement cannot tell a hot spot", counts)
	}
}

const (
	floodWorkers  = 8
	floodRequests = 400
	sysBlocks     = 64 // a 1024-token system prompt
	ownBlocks     = 4  // each request's own 64 tokens
)

// runFlood routes floodRequests sharing a system prompt cached on w0 and
// returns how many each worker took and the order of choices.
func runFlood(t *testing.T, weight float64, lifetime int) (map[string]int, []string) {
	t.Helper()
	o := testOptions(newFakeClock(), 11)
	// The old cost: weight × prefill + decode, no per-request term.
	o.CostModel, o.OverlapWeight, o.DecodeActiveRequestWeight = CostDefault, weight, 0
	if weight == 0 { // the latency cost model instead, with its defaults
		o.DecodeActiveRequestWeight = DefaultDecodeActiveRequests
		o.CostModel = CostLatency
	}
	r := newTestScheduler(t, o, floodWorkers)
	// A miniature index: which workers hold the system prompt.
	cached := map[string]bool{"w0": true}
	counts := map[string]int{}
	var live, order []string
	for i := range floodRequests {
		req := &Request{ID: fmt.Sprint("r", i), PromptTokens: (sysBlocks + ownBlocks) * 16,
			Hashes: hashes(1, sysBlocks, ownBlocks, i)}
		cs := r.Pool().AppendCandidates(nil, "m")
		for j := range cs {
			if cached[cs[j].Worker] {
				cs[j].MatchedBlocks, cs[j].CachedBlocks = sysBlocks, sysBlocks
			}
		}
		d, err := r.Route(t.Context(), req, cs, nil)
		if err != nil {
			t.Fatal(err)
		}
		cached[d.Worker] = true
		counts[d.Worker]++
		order = append(order, d.Worker)
		// The previous request's first token arrives; the oldest finishes
		// once lifetime requests are in flight.
		if len(live) > 0 {
			r.Pool().PrefillDone(live[len(live)-1])
		}
		live = append(live, req.ID)
		if len(live) > lifetime {
			r.Pool().Free(live[0])
			live = live[1:]
		}
	}
	return counts, order
}

// Without a Rand the scheduler draws from the runtime's per-thread
// generators, so concurrent picks share no lock; a caller's source (a seeded
// *rand.Rand, not safe for concurrent use) is serialised, and ties still
// spread over every tied worker with either.
func TestDefaultRandTakesNoLock(t *testing.T) {
	if _, ok := (Options{}).withDefaults().Rand.(runtimeRand); !ok {
		t.Fatalf("default Rand is %T, want runtimeRand", (Options{}).withDefaults().Rand)
	}
	seeded := Options{Rand: rand.New(rand.NewPCG(1, 2))}.withDefaults()
	if _, ok := seeded.Rand.(*lockedRand); !ok {
		t.Fatalf("a seeded source is %T, want it wrapped in lockedRand", seeded.Rand)
	}
	loads := make([]Load, 4)
	for _, r := range []Rand{runtimeRand{}, seeded.Rand} {
		var wg sync.WaitGroup
		var mu sync.Mutex
		seen := map[int]int{}
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 1000; k++ {
					i := selectLogit(loads, 0, r)
					mu.Lock()
					seen[i]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for i := range loads {
			if seen[i] < 500 {
				t.Fatalf("%T: worker %d won %d of 4000 four-way ties, want about 1000", r, i, seen[i])
			}
		}
	}
}
