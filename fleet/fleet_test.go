package fleet

import (
	"strings"
	"testing"
)

func TestWorkerValidate(t *testing.T) {
	ok := Worker{ID: "w0", Model: "m", Address: "10.0.0.1:8000", BlockSize: 16}
	tests := []struct {
		name string
		edit func(*Worker)
		want string // substring of the error; "" means valid
	}{
		{"complete record", func(*Worker) {}, ""},
		{"empty id", func(w *Worker) { w.ID = "" }, "id is empty"},
		{"empty model", func(w *Worker) { w.Model = "" }, "model is empty"},
		{"block size zero", func(w *Worker) { w.BlockSize = 0 }, "block size 0"},
		{"negative capacity", func(w *Worker) { w.MaxNumSeqs = -1 }, "negative capacity"},
		{"negative weight", func(w *Worker) { w.Weight = -1 }, "weight"},
	}
	for _, tt := range tests {
		w := ok
		tt.edit(&w)
		err := w.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v, want nil", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: Validate() = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

func TestWorkerDefaults(t *testing.T) {
	w := Worker{ID: "w0", Model: "base", LoRAAdapters: []string{"ada"}}
	if w.ClusterName() != "w0" || w.EffectiveWeight() != 1 {
		t.Errorf("zero Cluster/Weight: got %q, %g; want the id and 1", w.ClusterName(), w.EffectiveWeight())
	}
	if !w.Serves("base") || !w.Serves("ada") || w.Serves("other") {
		t.Error("Serves must accept the base model and its adapters only")
	}
}

func TestSyncEventValidate(t *testing.T) {
	tests := []struct {
		name string
		ev   SyncEvent
		ok   bool
	}{
		{"add", SyncEvent{Router: "r", Op: OpAdd, ID: "q", Worker: "w"}, true},
		{"add without worker", SyncEvent{Router: "r", Op: OpAdd, ID: "q"}, false},
		{"free without id", SyncEvent{Router: "r", Op: OpFree}, false},
		{"reset", SyncEvent{Router: "r", Op: OpReset}, true},
		{"heartbeat without interval", SyncEvent{Router: "r", Op: OpHeartbeat}, false},
		{"heartbeat", SyncEvent{Router: "r", Op: OpHeartbeat, IntervalMS: 100}, true},
		{"no router", SyncEvent{Op: OpReset}, false},
		{"unknown op", SyncEvent{Router: "r", Op: "nope", ID: "q"}, false},
		{"too many hashes", SyncEvent{Router: "r", Op: OpAdd, ID: "q", Worker: "w", Hashes: make([]uint64, maxSyncHashes+1)}, false},
	}
	for _, tt := range tests {
		if err := tt.ev.Validate(); (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}
