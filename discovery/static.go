package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"sigs.k8s.io/yaml"
)

// workersFile is the static file's layout: either a bare list of records or
// an object with a "workers" list.
type workersFile struct {
	Workers []scoring.WorkerSpec `json:"workers"`
}

// ParseWorkersFile is ParseWorkersFileWith under the default address
// policy.
func ParseWorkersFile(data []byte) ([]scoring.WorkerSpec, error) {
	return ParseWorkersFileWith(data, nil)
}

// ParseWorkersFileWith decodes a static workers file, YAML or JSON, and
// validates every record. Duplicate ids are an error.
func ParseWorkersFileWith(data []byte, policy *AddressPolicy) ([]scoring.WorkerSpec, error) {
	var recs []scoring.WorkerSpec
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("workers file: %w", err)
	}
	js = bytes.TrimSpace(js)
	switch {
	case len(js) == 0 || bytes.Equal(js, []byte("null")):
		return nil, nil
	case js[0] == '[':
		if err := yaml.UnmarshalStrict(js, &recs); err != nil {
			return nil, fmt.Errorf("workers file: %w", err)
		}
	default:
		var f workersFile
		if err := yaml.UnmarshalStrict(js, &f); err != nil {
			return nil, fmt.Errorf("workers file: %w", err)
		}
		recs = f.Workers
	}
	seen := make(map[string]bool, len(recs))
	var errs []error
	for i, r := range recs {
		if err := ValidateRecordWith(r, policy); err != nil {
			errs = append(errs, fmt.Errorf("entry %d: %w", i, err))
			continue
		}
		if seen[r.ID] {
			errs = append(errs, fmt.Errorf("entry %d: duplicate worker id %q", i, r.ID))
		}
		seen[r.ID] = true
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("workers file: %w", errors.Join(errs...))
	}
	return recs, nil
}

// LoadWorkersFile reads and parses a static workers file.
func LoadWorkersFile(path string) ([]scoring.WorkerSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workers file: %w", err)
	}
	recs, err := ParseWorkersFile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// FileOptions tune WatchFile. The zero value works.
type FileOptions struct {
	// Interval is how often the file is checked for changes. Zero means 2 s.
	Interval time.Duration
	// OnBadFile is called when a changed file does not parse; the previous
	// fleet stays in place.
	OnBadFile func(err error)
	// Logger receives reload events. Nil means slog.Default().
	Logger *slog.Logger
	// Policy refuses worker addresses; nil is the default policy.
	Policy *AddressPolicy
}

// FileWatcher mirrors a static workers file into a Sink, reloading it when
// its contents change. Polling keeps it working on every filesystem,
// including Kubernetes ConfigMap mounts that swap a symlink.
type FileWatcher struct {
	path  string
	sink  Sink
	opts  FileOptions
	last  []byte
	known map[string]scoring.WorkerSpec
}

// NewFileWatcher loads path once and applies it to sink; a file that cannot
// be read or parsed is an error here, since the router would have no fleet.
func NewFileWatcher(path string, sink Sink, opts FileOptions) (*FileWatcher, error) {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	fw := &FileWatcher{path: path, sink: sink, opts: opts, known: map[string]scoring.WorkerSpec{}}
	if _, err := fw.reload(); err != nil {
		return nil, err
	}
	return fw, nil
}

// Run re-checks the file every Interval until ctx ends.
func (fw *FileWatcher) Run(ctx context.Context) error {
	t := time.NewTicker(fw.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			changed, err := fw.reload()
			if err != nil {
				fw.opts.Logger.Warn("workers file not reloaded; keeping the previous fleet", "path", fw.path, "err", err)
				if fw.opts.OnBadFile != nil {
					fw.opts.OnBadFile(err)
				}
			} else if changed {
				fw.opts.Logger.Info("workers file reloaded", "path", fw.path, "workers", len(fw.known))
			}
		}
	}
}

// reload applies the file if its bytes changed since the last good load.
func (fw *FileWatcher) reload() (bool, error) {
	data, err := os.ReadFile(fw.path)
	if err != nil {
		return false, fmt.Errorf("workers file: %w", err)
	}
	if fw.last != nil && bytes.Equal(data, fw.last) {
		return false, nil
	}
	recs, err := ParseWorkersFileWith(data, fw.opts.Policy)
	if err != nil {
		fw.last = data // report a bad file once, not every tick
		return false, fmt.Errorf("%s: %w", fw.path, err)
	}
	fw.last = data
	next := make(map[string]scoring.WorkerSpec, len(recs))
	for _, r := range recs {
		next[r.ID] = r
		fw.sink.Upsert(r)
	}
	for id := range fw.known {
		if _, ok := next[id]; !ok {
			fw.sink.Remove(id)
		}
	}
	fw.known = next
	return true, nil
}
