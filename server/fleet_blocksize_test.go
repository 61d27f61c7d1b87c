package server

import (
	"log/slog"
	"testing"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// specListener keeps the last spec each worker was upserted with.
type specListener map[string]fleet.Worker

func (l specListener) Upsert(w fleet.Worker) { l[w.ID] = w }
func (l specListener) Remove(id string)      { delete(l, id) }

// A worker registered with one block size whose engine states another:
// the engine's wins everywhere, survives the record being read again, is
// learned once, and goes with the worker.
func TestFleetLearnsTheEnginesBlockSize(t *testing.T) {
	pool, kept := specListener{}, specListener{}
	learned := map[string]int{}
	f := &roster{log: slog.New(slog.DiscardHandler), records: map[string]fleet.Worker{},
		listeners: []fleet.Sink{pool}, kept: []fleet.Sink{kept},
		learned: func(id string, n int) { learned[id] = n }}
	rec := fleet.Worker{ID: "w", Model: "m", Address: "10.0.0.1:8000", BlockSize: 16}
	f.Upsert(rec)
	if f.learnBlockSize("stranger", 32) {
		t.Fatal("learned a block size for a worker the fleet does not hold")
	}
	if f.learnBlockSize("w", 16) {
		t.Fatal("learned the block size the record already says")
	}
	if !f.learnBlockSize("w", 32) {
		t.Fatal("the engine's block size 32 was not taken over the record's 16")
	}
	if pool["w"].BlockSize != 32 || kept["w"].BlockSize != 32 || learned["w"] != 32 {
		t.Fatalf("pool %d, index %d, metric %d: want 32 everywhere", pool["w"].BlockSize, kept["w"].BlockSize, learned["w"])
	}
	if f.learnBlockSize("w", 64) {
		t.Fatal("a second, different size was learned: events that disagree must not flap the worker")
	}
	f.Upsert(rec) // the workers file read again
	if pool["w"].BlockSize != 32 {
		t.Fatalf("after the record was read again the pool has block size %d, want the engine's 32", pool["w"].BlockSize)
	}
	f.Remove("w")
	if _, ok := learned["w"]; !ok || learned["w"] != 0 {
		t.Fatalf("metric after removal: %v, want the worker's series dropped", learned)
	}
	f.Upsert(rec)
	if pool["w"].BlockSize != 16 {
		t.Fatalf("a worker that came back starts from its record's block size, got %d", pool["w"].BlockSize)
	}
}

// indexFirst is a listener that checks, when told of a worker, that the
// KV index already knows it, as an engine feed or a cold start's resync
// needs: the event core drops a batch for a worker the index lacks.
type indexFirst struct {
	ix     *kvindex.Index
	missed []string
}

func (l *indexFirst) Upsert(w fleet.Worker) {
	if !l.ix.HasWorker(w.ID) {
		l.missed = append(l.missed, w.ID)
	}
}
func (l *indexFirst) Remove(string) {}

// Every way a worker reaches the roster (discovery, the engine's block
// size, a restored state file) tells the index before the other listeners.
func TestFleetTellsTheIndexFirst(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	check := &indexFirst{ix: ix}
	f := &roster{log: slog.New(slog.DiscardHandler), records: map[string]fleet.Worker{},
		listeners: []fleet.Sink{check}, kept: []fleet.Sink{indexListener{ix, true}}}
	f.Upsert(fleet.Worker{ID: "w", Model: "m", Address: "10.0.0.1:8000", BlockSize: 16})
	f.learnBlockSize("w", 32)
	f.restore([]fleet.Worker{{ID: "r", Model: "m", Address: "10.0.0.2:8000", BlockSize: 16}})
	if len(check.missed) > 0 {
		t.Fatalf("listeners heard of %v before the index knew them", check.missed)
	}
	if !ix.HasWorker("r") {
		t.Fatal("the restored worker is not in the index")
	}
}

// acceptingPool takes every load report.
type acceptingPool struct{}

func (acceptingPool) SetLoadReport(string, fleet.LoadReport) error { return nil }

// refusingPool fails every load report, as the pool does for a worker it
// does not hold.
type refusingPool struct{}

func (refusingPool) SetLoadReport(string, fleet.LoadReport) error { return scoring.ErrUnknownWorker }

// A worker's KV capacity, from its record or its engine's load reports,
// reaches the KV index; a report the pool refuses does not.
func TestCapacityReachesTheIndex(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	indexListener{ix, true}.Upsert(fleet.Worker{ID: "w", Model: "m", BlockSize: 16, KVTotalBlocks: 3000})
	if c := ix.Capacity("w"); c != 3000 {
		t.Fatalf("capacity from the record: %d, want 3000", c)
	}
	if err := (reservingLoad{refusingPool{}, ix}).SetLoadReport("w", fleet.LoadReport{KVTotalBlocks: 5000}); err == nil {
		t.Fatal("the pool's error was not returned")
	}
	if c := ix.Capacity("w"); c != 3000 {
		t.Fatalf("a refused report changed the capacity to %d", c)
	}
	if err := (reservingLoad{acceptingPool{}, ix}).SetLoadReport("w", fleet.LoadReport{KVTotalBlocks: 5000}); err != nil {
		t.Fatal(err)
	}
	if c := ix.Capacity("w"); c != 5000 {
		t.Fatalf("capacity from the engine's report: %d, want 5000", c)
	}
	// --index-grow-tables: neither path sizes the table.
	indexListener{ix, false}.Upsert(fleet.Worker{ID: "g", Model: "m", BlockSize: 16, KVTotalBlocks: 3000})
	if err := (reservingLoad{acceptingPool{}, nil}).SetLoadReport("g", fleet.LoadReport{KVTotalBlocks: 5000}); err != nil {
		t.Fatal(err)
	}
	if c := ix.Capacity("g"); c != 0 {
		t.Fatalf("with the tables left to grow, capacity %d was reserved", c)
	}
	r := &Server{cfg: Config{IndexGrowTables: true}, index: ix}
	if r.reserveIndex() != nil {
		t.Fatal("--index-grow-tables: load reports still size the index's tables")
	}
}
