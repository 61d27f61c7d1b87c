package server

import (
	"sync"
	"testing"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/nats-io/nats.go"
)

// A cold-started router (no snapshot) asks every worker it discovers to
// re-announce its cache, once, and the answer fills its index; the
// workers are not marked stale while it waits.
func TestColdStartAsksWorkersToResync(t *testing.T) {
	testenv.Quiet()
	n := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATSURL, cfg.WorkersFile = n.URL, workersFile(t, 2)
	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	reasons := map[string][]string{}
	for _, w := range []string{"w0", "w1"} {
		sub, err := bus.ServeResync(nc, cfg.Namespace, w, func(req bus.ResyncRequest) error {
			mu.Lock()
			reasons[w] = append(reasons[w], req.Reason)
			mu.Unlock()
			if w != "w0" {
				return nil
			}
			// w0 re-announces what it holds, as kvsim does.
			hs := []vllmwire.EngineHash{vllmwire.HashInt(1), vllmwire.HashInt(2)}
			toks := make([]uint32, 32)
			for i := range toks {
				toks[i] = uint32(100 + i)
			}
			return bus.PublishEvents(nc, cfg.Namespace, "w0", 0, vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{
				vllmwire.AllBlocksCleared{}, vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: 16},
			}})
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	r := start(t, cfg)
	eventually(t, "w0's re-announced blocks in the index", func() bool { return r.Index().Stats().Entries == 2 })
	eventually(t, "both workers asked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reasons["w0"]) > 0 && len(reasons["w1"]) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	for _, w := range []string{"w0", "w1"} {
		if got := reasons[w]; len(got) != 1 || got[0] != "cold_start" {
			t.Errorf("%s was asked %v, want one cold_start request", w, got)
		}
	}
	if r.index.NeedsResync("w1") {
		t.Error("w1 is marked stale while its answer is awaited; a cold start has no hole to mark")
	}
}
