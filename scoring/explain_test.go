package scoring

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/fleet"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run with -update to create it)", path, err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file:\n got:\n%s\nwant:\n%s", name, got, want)
	}
}

// explainFleet routes one request over three workers with known load and
// returns the explanation.
func explainFleet(t *testing.T, change func(*Options)) *Explanation {
	t.Helper()
	o := testOptions(newFakeClock(), 1)
	change(&o)
	r := newTestScheduler(t, o, 3)
	// w1 carries 25 blocks of someone else's request, half prefilled.
	bg := &Request{ID: "bg", PromptTokens: 400, Hashes: hashes(9, 25, 0, 0)}
	if err := r.Pool().Add(bg, "w1", 0); err != nil {
		t.Fatal(err)
	}
	r.Pool().PrefillDone("bg")
	if err := r.Pool().SetLoadReport("w2", fleet.LoadReport{Waiting: 2, Running: 3, KVUsedBlocks: 300}); err != nil {
		t.Fatal(err)
	}
	cs := []Candidate{
		{Worker: "w0", MatchedBlocks: 0, CachedBlocks: 0},
		{Worker: "w1", MatchedBlocks: 90, CachedBlocks: 15},
		{Worker: "w2", MatchedBlocks: 40, CachedBlocks: 120},
	}
	exp := &Explanation{}
	if _, err := r.Pick(&Request{ID: "req-1", PromptTokens: 3048}, cs, exp); err != nil {
		t.Fatal(err)
	}
	return exp
}

// defaultCost is the default cost model as the seeds had it: no
// per-request term.
func defaultCost(o *Options) { o.CostModel, o.DecodeActiveRequestWeight = CostDefault, 0 }

func TestExplanationRendersTheSeedLogLine(t *testing.T) {
	exp := explainFleet(t, defaultCost)
	// The seeds' line format from real terms: 3048 tokens with 90 of
	// 16-token blocks cached leave 100.5 prefill blocks; decode is w1's 25
	// active blocks plus the request's own 191.
	if got, want := exp.Line(1), "worker=w1 logit=316.5 = 1.0*100.5 + 216.0 (cached_blocks=15)"; got != want {
		t.Errorf("line = %q, want %q", got, want)
	}
	golden(t, "explain_default.golden", exp.String()+"\n")
}

func TestExplanationGoldens(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Options)
	}{
		{"explain_weighted.golden", func(o *Options) { o.CostModel = CostWeighted }},
		{"explain_temperature.golden", func(o *Options) { defaultCost(o); o.Temperature = 0.5 }},
		{"explain_latency.golden", func(*Options) {}},
		{"explain_least_loaded.golden", func(o *Options) { o.Mode = ModeLeastLoaded }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, tt.name, explainFleet(t, tt.change).String()+"\n")
		})
	}
}

func TestExplanationMarshalsToJSON(t *testing.T) {
	exp := explainFleet(t, defaultCost)
	data, err := json.MarshalIndent(exp, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "explain_default.json", string(data)+"\n")
	var back Explanation
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Chosen != exp.Chosen || len(back.Workers) != 3 || back.Workers[1].PrefillBlocks != 100.5 {
		t.Errorf("round trip lost terms: %+v", back)
	}
}

func TestExplanationIsReusable(t *testing.T) {
	exp := explainFleet(t, func(*Options) {})
	first := exp.String()
	r := newTestScheduler(t, testOptions(newFakeClock(), 1), 2)
	if _, err := r.Pick(&Request{ID: "other", PromptTokens: 32}, cands(0, 1), exp); err != nil {
		t.Fatal(err)
	}
	if len(exp.Workers) != 2 || exp.RequestID != "other" || exp.String() == first {
		t.Errorf("reused explanation not overwritten: %s", exp)
	}
}
