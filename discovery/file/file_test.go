package file

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv/sourcetest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		ids     []string
		wantErr string
	}{
		{name: "yaml object", data: "workers:\n- id: w0\n  model: m\n  address: 10.0.0.1:8000\n  block_size: 16\n  kv_total_blocks: 10\n", ids: []string{"w0"}},
		{name: "yaml list with a comment", data: "# fleet\n- {id: w0, model: m, address: '10.0.0.1:8000', block_size: 16}\n- {id: w1, model: m, address: '10.0.0.2:8000', block_size: 16, lora_adapters: [a]}\n", ids: []string{"w0", "w1"}},
		{name: "json list", data: `[{"id":"w0","model":"m","address":"10.0.0.1:8000","block_size":16}]`, ids: []string{"w0"}},
		{name: "json object", data: `{"workers":[{"id":"w0","model":"m","address":"10.0.0.1:8000","block_size":16}]}`, ids: []string{"w0"}},
		{name: "empty file", data: "\n", ids: nil},
		{name: "invalid record", data: `[{"id":"w0","model":"m","address":"nope","block_size":16}]`, wantErr: "not host:port"},
		{name: "duplicate id", data: `[{"id":"w0","model":"m","address":"1.1.1.1:1","block_size":16},{"id":"w0","model":"m","address":"1.1.1.1:2","block_size":16}]`, wantErr: "duplicate"},
		{name: "typo in a field name", data: "- {id: w0, model: m, address: '1.1.1.1:1', blocksize: 16}\n", wantErr: "blocksize"},
		{name: "not yaml", data: "workers: [", wantErr: "workers file"},
		{name: "wrong shape", data: `"just a string"`, wantErr: "workers file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := Parse([]byte(tt.data), nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != len(tt.ids) {
				t.Fatalf("got %d records, want %v", len(recs), tt.ids)
			}
			for i, id := range tt.ids {
				if recs[i].ID != id {
					t.Errorf("record %d id %q, want %q", i, recs[i].ID, id)
				}
			}
		})
	}
}

// writeFile replaces path's contents by rename, as ConfigMap updates and
// editors do.
func writeFile(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestWatcherReloadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.yaml")
	writeFile(t, path, "- {id: w0, model: m, address: '10.0.0.1:8000', block_size: 16}\n- {id: w1, model: m, address: '10.0.0.2:8000', block_size: 16}\n")
	fw, err := New(Config{Path: path, Interval: 20 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	sink, obs := sourcetest.NewSink(), &sourcetest.Observer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fw.Run(ctx, sink, obs) }()
	<-fw.Synced()
	if _, ok := sink.Get("w1"); !ok {
		t.Fatal("initial load missing w1")
	}

	writeFile(t, path, "- {id: w0, model: m, address: '10.0.0.1:8000', block_size: 32}\n- {id: w2, model: m, address: '10.0.0.3:8000', block_size: 16}\n")
	sourcetest.Eventually(t, "reload", func() bool {
		r, _ := sink.Get("w0")
		_, w1 := sink.Get("w1")
		_, w2 := sink.Get("w2")
		return r.BlockSize == 32 && !w1 && w2
	})

	writeFile(t, path, "- {id: w0, model: m, address: broken, block_size: 16}\n")
	sourcetest.Eventually(t, "bad file reported", func() bool { return obs.Bad() == 1 })
	if _, ok := sink.Get("w2"); !ok {
		t.Error("a bad file dropped the previous fleet")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v", err)
	}
	if bad := obs.Bad(); bad != 1 {
		t.Errorf("the bad file was reported %d times, want once", bad)
	}
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "- {id: w0}\n")
	for _, cfg := range []Config{
		{},
		{Path: filepath.Join(dir, "missing.yaml")},
		{Path: bad},
		{Path: bad, Interval: -time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// fileBackend is a workers file the contract edits.
type fileBackend struct {
	path    string
	workers map[string]fleet.Worker
}

func (b *fileBackend) Open(t *testing.T) discovery.Source {
	fw, err := New(Config{Path: b.path, Interval: 10 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return fw
}

func (b *fileBackend) write(t *testing.T) {
	ws := slices.SortedFunc(maps.Values(b.workers), func(a, b fleet.Worker) int { return strings.Compare(a.ID, b.ID) })
	data, err := json.Marshal(ws)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, b.path, string(data))
}

func (b *fileBackend) Put(t *testing.T, w fleet.Worker) { b.workers[w.ID] = w; b.write(t) }
func (b *fileBackend) Delete(t *testing.T, id string)   { delete(b.workers, id); b.write(t) }
func (b *fileBackend) PutBad(t *testing.T)              { writeFile(t, b.path, "workers: [") }

func TestWatcherKeepsTheSourceContract(t *testing.T) {
	sourcetest.Run(t, &fileBackend{path: filepath.Join(t.TempDir(), "workers.json"), workers: map[string]fleet.Worker{}})
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("workers:\n- id: w0\n  model: m\n  address: 10.0.0.1:8000\n  block_size: 16\n"))
	f.Add([]byte(`[{"id":"w0","model":"m","address":"10.0.0.1:8000","block_size":16}]`))
	f.Add([]byte("- {id: w0}\n"))
	f.Add([]byte("workers: null"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := Parse(data, nil)
		if err != nil {
			return
		}
		for _, r := range recs {
			if r.Validate() != nil {
				t.Fatalf("invalid record %+v returned without error", r)
			}
		}
	})
}
