package vsim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// Measuring the router's CPU times the real calls without changing what
// they decide: the sweep's points are the same with and without it, and
// the cost it adds says what the run did.
func TestRouterCostLeavesDecisionsAlone(t *testing.T) {
	w := smallAgent(t)
	opt := SweepOptions{Fleet: smallFleet(), Router: scoring.DefaultOptions(), Modes: []string{"kv", "round_robin"},
		Loads: []float64{1}, SLO: 2 * time.Second, Seed: 1, Parallel: 1}
	plain, err := Sweep(w, opt)
	if err != nil {
		t.Fatal(err)
	}
	opt.RouterCost = true
	measured, err := Sweep(w, opt)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(plain.Sweep)
	b, _ := json.Marshal(measured.Sweep)
	if string(a) != string(b) {
		t.Fatalf("measuring changed the results:\n%s\n%s", a, b)
	}
	if plain.RouterCost != nil || strings.Contains(plain.Markdown(), "Router CPU") {
		t.Error("a sweep without RouterCost reports router CPU")
	}
	kv := measured.RouterCost["kv"][0]
	if kv.Match.Calls != w.Requests() || kv.Decide.Calls != w.Requests() || kv.Hash.Calls != w.Requests() {
		t.Errorf("kv: %d matches, %d decisions, %d hashes; want one each per request (%d)",
			kv.Match.Calls, kv.Decide.Calls, kv.Hash.Calls, w.Requests())
	}
	if kv.EventBlocks == 0 || kv.IndexEntries == 0 || kv.IndexHeapBytes <= 0 || kv.RouterCPUSeconds <= 0 {
		t.Errorf("kv: %d event blocks, %d index entries, %d heap bytes, %g s router CPU; want all positive",
			kv.EventBlocks, kv.IndexEntries, kv.IndexHeapBytes, kv.RouterCPUSeconds)
	}
	if kv.RouterCPUSeconds > kv.RunCPUSeconds {
		t.Errorf("router CPU %g s exceeds the whole run's %g s", kv.RouterCPUSeconds, kv.RunCPUSeconds)
	}
	rr := measured.RouterCost["round_robin"][0]
	if rr.Match.Calls != 0 || rr.EventBlocks != 0 || rr.Decide.Calls != w.Requests() {
		t.Errorf("round_robin: %d matches, %d event blocks, %d decisions; want no index work and one decision per request",
			rr.Match.Calls, rr.EventBlocks, rr.Decide.Calls)
	}
	if !strings.Contains(measured.Markdown(), "Router CPU") {
		t.Error("the Markdown has no router CPU table")
	}
}
