package server

import (
	"testing"

	"github.com/kvroute/kvroute/scoring"
)

// Reconfigure applies routing options to the running scheduler, maps kv to
// kv_without_events as startup does, and keeps the options in use when it
// refuses.
func TestReconfigureRunningRouter(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 2)
	cfg.KVEvents = false
	r := start(t, cfg)
	o := cfg.Scoring
	o.Mode, o.CostModel, o.WeightedA = scoring.ModeKV, scoring.CostWeighted, 7
	if err := r.Reconfigure(o); err != nil {
		t.Fatal(err)
	}
	got := r.sched.Load().Options()
	if r.Mode() != scoring.ModeKVWithoutEvents || got.CostModel != scoring.CostWeighted || got.WeightedA != 7 {
		t.Errorf("mode %s, options %+v", r.Mode(), got)
	}
	o.Mode = "nope"
	if err := r.Reconfigure(o); err == nil || r.Mode() != scoring.ModeKVWithoutEvents {
		t.Errorf("bad mode: err %v, mode %s", err, r.Mode())
	}
}
