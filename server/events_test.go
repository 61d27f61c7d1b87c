package server

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
)

// The load source is the one --engine-load names: over NATS the router
// subscribes to load reports, with scrape it does not, even with NATS up
// (here for replica sync), so the two never both feed the pool.
func TestLoadComesFromTheNamedSourceOnly(t *testing.T) {
	tests := []struct {
		name      string
		load      string
		subscribe bool
	}{
		{"nats (default)", EngineLoadNATS, true},
		{"scrape, with NATS up for replica sync", EngineLoadScrape, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.WorkersFile, cfg.EngineLoad, cfg.ReplicaSync = workersFile(t, 1), tt.load, true
			cfg.EngineReplayPort = -1
			r := start(t, cfg)
			if r.natsSrv == nil {
				t.Fatal("want the embedded NATS server up")
			}
			subscribed := r.natsSrv.GlobalAccount().SubscriptionInterest(bus.LoadSubject(cfg.Namespace, "w0"))
			if subscribed != tt.subscribe || (r.loadReports != nil) != tt.subscribe {
				t.Fatalf("load reports subscribed: %v (adapter %v), want %v", subscribed, r.loadReports != nil, tt.subscribe)
			}
			if (r.EngineFeeds() != nil) == tt.subscribe {
				t.Fatalf("engine feeds running: %v, want %v", r.EngineFeeds() != nil, !tt.subscribe)
			}
			if !tt.subscribe {
				return
			}
			// The capacity a report states sizes the worker's table in the
			// KV index, over the record's.
			if err := r.nc.Publish(bus.LoadSubject(cfg.Namespace, "w0"), []byte(`{"running":1,"kv_used_blocks":10,"kv_total_blocks":6000}`)); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for r.index.Capacity("w0") != 6000 {
				if time.Now().After(deadline) {
					t.Fatalf("the KV index reserved %d blocks for w0 after its load report said 6000 (its record 4096)", r.index.Capacity("w0"))
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
