package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/discovery/file"
	"github.com/kvroute/kvroute/fleet"
)

func TestWorkersFileIsReadableByTheRouter(t *testing.T) {
	recs := []fleet.Worker{
		{ID: "w0", Model: "m", Address: "127.0.0.1:8100", BlockSize: 64, KVTotalBlocks: 16384, MaxNumSeqs: 256, MaxNumBatchedTokens: 8192},
		{ID: "w1", Model: "m", Address: "127.0.0.1:8101", BlockSize: 64, KVTotalBlocks: 16384, MaxNumSeqs: 256, MaxNumBatchedTokens: 8192},
	}
	path := filepath.Join(t.TempDir(), "workers.json")
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeWorkersFile(path, recs); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := file.Parse(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, recs) {
		t.Fatalf("read back %+v, want %+v", got, recs)
	}
	if err := writeWorkersFile(filepath.Join(t.TempDir(), "missing", "w.json"), recs); err == nil {
		t.Fatal("writing into a missing folder succeeded")
	}
}
