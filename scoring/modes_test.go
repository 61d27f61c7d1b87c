package scoring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestModeNamesAndConstructor(t *testing.T) {
	want := []string{"kv", "kv_without_events", "least_loaded", "power_of_two", "random", "round_robin", "weighted"}
	if got := ModeNames(); !slices.Equal(got, want) {
		t.Errorf("ModeNames() = %v, want %v", got, want)
	}
	for _, name := range append(want, "kv-without-events", "Round-Robin") {
		m, err := NewMode(name, DefaultOptions())
		if err != nil {
			t.Errorf("NewMode(%q): %v", name, err)
			continue
		}
		if normalizeName(name) != m.Name() {
			t.Errorf("NewMode(%q).Name() = %q", name, m.Name())
		}
	}
	if _, err := NewMode("fastest", DefaultOptions()); err == nil {
		t.Error("NewMode accepted an unknown name")
	}
	sources := map[string]OverlapSource{"kv": OverlapEvents, "kv_without_events": OverlapApprox, "random": OverlapNone}
	for name, want := range sources {
		m, _ := NewMode(name, DefaultOptions())
		if got := m.Overlap(); got != want {
			t.Errorf("%s overlap source = %v, want %v", name, got, want)
		}
	}
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Options)
		ok     bool
	}{
		{"defaults", func(*Options) {}, true},
		{"zero options", func(o *Options) { *o = Options{} }, true},
		{"weighted cost", func(o *Options) { o.CostModel = CostWeighted }, true},
		{"unknown cost", func(o *Options) { o.CostModel = "cheap" }, false},
		{"unknown mode", func(o *Options) { o.Mode = "fastest" }, false},
		{"unknown policy", func(o *Options) { o.QueuePolicy = "sjf" }, false},
		{"negative temperature", func(o *Options) { o.Temperature = -1 }, false},
		{"negative overlap weight", func(o *Options) { o.OverlapWeight = -0.5 }, false},
		{"negative max wait", func(o *Options) { o.QueueMaxWait = -1 }, false},
		{"queue disabled", func(o *Options) { o.QueueThreshold = -1 }, true},
	}
	for _, tt := range tests {
		o := DefaultOptions()
		tt.change(&o)
		if err := o.Validate(); (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func loadsN(n int) []Load {
	out := make([]Load, n)
	for i := range out {
		out[i] = Load{ID: fmt.Sprint("w", i), Weight: 1}
	}
	return out
}

func seeded(seed uint64) Rand { return &lockedRand{r: rand.New(rand.NewPCG(seed, seed+1))} }

func TestRoundRobinCycles(t *testing.T) {
	m := &RoundRobin{}
	var got []int
	for range 7 {
		got = append(got, m.Pick(&Request{}, loadsN(3), nil))
	}
	if want := []int{0, 1, 2, 0, 1, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("round robin order %v, want %v", got, want)
	}
}

func TestLeastLoadedPicksFewestBlocksThenRequests(t *testing.T) {
	tests := []struct {
		name   string
		blocks []int
		reqs   []int
		want   int
	}{
		{"fewest blocks", []int{10, 3, 7}, []int{1, 5, 1}, 1},
		{"ties on blocks go to fewer requests", []int{3, 3, 7}, []int{4, 2, 0}, 1},
	}
	for _, tt := range tests {
		ls := loadsN(len(tt.blocks))
		for i := range ls {
			ls[i].ActiveBlocks, ls[i].ActiveRequests = tt.blocks[i], tt.reqs[i]
		}
		if got := (&LeastLoaded{rand: seeded(1)}).Pick(&Request{}, ls, nil); got != tt.want {
			t.Errorf("%s: picked %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestPowerOfTwoNeverPicksTheMostLoaded(t *testing.T) {
	ls := loadsN(4)
	for i := range ls {
		ls[i].ActiveBlocks = 10 * (i + 1)
	}
	m := &PowerOfTwo{rand: seeded(5)}
	counts := make([]int, 4)
	for range 6000 {
		counts[m.Pick(&Request{}, ls, nil)]++
	}
	// Worker i wins when drawn with a more loaded one: (3-i) of 6 pairs.
	for i, want := range []int{3000, 2000, 1000, 0} {
		if d := counts[i] - want; d < -200 || d > 200 {
			t.Errorf("worker %d picked %d times, want about %d (counts %v)", i, counts[i], want, counts)
		}
	}
	if got := m.Pick(&Request{}, ls[:1], nil); got != 0 {
		t.Errorf("single candidate: picked %d", got)
	}
}

func TestWeightedFollowsDeclaredWeights(t *testing.T) {
	ls := loadsN(3)
	for i, w := range []float64{1, 2, 5} {
		ls[i].Weight = w
	}
	m := &Weighted{rand: seeded(9)}
	counts := make([]int, 3)
	const n = 16000
	for range n {
		counts[m.Pick(&Request{}, ls, nil)]++
	}
	var chi2 float64
	for i, w := range []float64{1, 2, 5} {
		exp := n * w / 8
		chi2 += (float64(counts[i]) - exp) * (float64(counts[i]) - exp) / exp
	}
	if chi2 > 13.82 { // 99.9th percentile, 2 dof
		t.Errorf("weighted counts %v do not follow weights 1:2:5 (chi-square %g)", counts, chi2)
	}
}

func TestRandomCoversEveryCandidate(t *testing.T) {
	m := &Random{rand: seeded(2)}
	counts := make([]int, 5)
	for range 5000 {
		counts[m.Pick(&Request{}, loadsN(5), nil)]++
	}
	for i, c := range counts {
		if c < 850 || c > 1150 {
			t.Errorf("worker %d picked %d of 5000", i, c)
		}
	}
}

func TestRouterSkipsUnknownCandidates(t *testing.T) {
	r := newTestScheduler(t, testOptions(newFakeClock(), 1), 2)
	cs := []Candidate{{Worker: "ghost", MatchedBlocks: 100}, {Worker: "w1", MatchedBlocks: 1}}
	d, err := r.Pick(&Request{ID: "r", PromptTokens: 64}, cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != "w1" || d.Index != 1 || d.Cluster != "w1" || d.Address != "10.0.0.1:8000" {
		t.Errorf("decision %+v, want w1 at index 1", d)
	}
	if _, err := r.Pick(&Request{ID: "r"}, []Candidate{{Worker: "ghost"}}, nil); err == nil {
		t.Error("pick among unknown workers succeeded")
	}
	if _, err := r.Route(t.Context(), &Request{ID: "r"}, nil, nil); err == nil {
		t.Error("route with no candidates succeeded")
	}
}

type recorder struct{ got map[string][]uint64 }

func (r *recorder) Record(worker string, h []uint64) { r.got[worker] = h }

func TestRouteRecordsDecisionsForTheApproximateIndex(t *testing.T) {
	rec := &recorder{got: map[string][]uint64{}}
	o := testOptions(newFakeClock(), 1)
	o.Mode = ModeKVWithoutEvents
	o.Recorder = rec
	r := newTestScheduler(t, o, 3)
	req := &Request{ID: "r", PromptTokens: 64, Hashes: []uint64{4, 5, 6, 7}}
	d, err := r.Route(t.Context(), req, cands(0, 0, 3), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != "w2" || !slices.Equal(rec.got["w2"], req.Hashes) || len(rec.got) != 1 {
		t.Errorf("decision %s, recorded %v", d.Worker, rec.got)
	}
	if !r.Pool().Active("r") {
		t.Error("Route did not add the request")
	}
}
