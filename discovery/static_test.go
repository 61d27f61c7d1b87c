package discovery

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseWorkersFile(t *testing.T) {
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
			recs, err := ParseWorkersFile([]byte(tt.data))
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

func TestFileWatcherReloadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.yaml")
	write := func(s string) {
		t.Helper()
		// Write-then-rename, as ConfigMap updates and editors do.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("- {id: w0, model: m, address: '10.0.0.1:8000', block_size: 16}\n- {id: w1, model: m, address: '10.0.0.2:8000', block_size: 16}\n")
	sink := newFleetSink()
	bad := make(chan error, 4)
	fw, err := NewFileWatcher(path, sink, FileOptions{Interval: 20 * time.Millisecond, Logger: quietLogger(), OnBadFile: func(err error) { bad <- err }})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sink.get("w1"); !ok {
		t.Fatal("initial load missing w1")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fw.Run(ctx) }()

	write("- {id: w0, model: m, address: '10.0.0.1:8000', block_size: 32}\n- {id: w2, model: m, address: '10.0.0.3:8000', block_size: 16}\n")
	eventually(t, "reload", func() bool {
		r, _ := sink.get("w0")
		_, w1 := sink.get("w1")
		_, w2 := sink.get("w2")
		return r.BlockSize == 32 && !w1 && w2
	})

	write("- {id: w0, model: m, address: broken, block_size: 16}\n")
	select {
	case <-bad:
	case <-time.After(5 * time.Second):
		t.Fatal("bad file not reported")
	}
	if _, ok := sink.get("w2"); !ok {
		t.Error("a bad file dropped the previous fleet")
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run returned %v", err)
	}
	if _, err := NewFileWatcher(filepath.Join(t.TempDir(), "missing.yaml"), sink, FileOptions{}); err == nil {
		t.Error("missing file accepted")
	}
}

func FuzzParseWorkersFile(f *testing.F) {
	f.Add([]byte("workers:\n- id: w0\n  model: m\n  address: 10.0.0.1:8000\n  block_size: 16\n"))
	f.Add([]byte(`[{"id":"w0","model":"m","address":"10.0.0.1:8000","block_size":16}]`))
	f.Add([]byte("- {id: w0}\n"))
	f.Add([]byte("workers: null"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ParseWorkersFile(data)
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
