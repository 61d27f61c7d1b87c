// Package file is worker discovery from a static workers file (YAML or
// JSON), for fleets without etcd: Watcher is a discovery.Source that
// reloads the file when it changes; Load and Parse read it for tools.
package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"sigs.k8s.io/yaml"
)

// workersFile is the static file's layout: either a bare list of records or
// an object with a "workers" list.
type workersFile struct {
	Workers []fleet.Worker `json:"workers"`
}

// Parse decodes a workers file, YAML or JSON, and validates every record
// under policy (nil: the default policy). Duplicate ids are an error.
func Parse(data []byte, policy *discovery.AddressPolicy) ([]fleet.Worker, error) {
	var recs []fleet.Worker
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
		if err := discovery.ValidateRecordWith(r, policy); err != nil {
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

// Load reads and parses a workers file under the default address policy.
func Load(path string) ([]fleet.Worker, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workers file: %w", err)
	}
	recs, err := Parse(data, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// Config configures a Watcher.
type Config struct {
	// Path is the workers file (--workers-file).
	Path string
	// Interval is how often the file is checked for changes. Zero means 2 s.
	Interval time.Duration
	// Policy refuses worker addresses; nil is the default policy.
	Policy *discovery.AddressPolicy
	// Logger receives reload events. Nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports the settings that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Path == "" {
		errs = append(errs, errors.New("no path"))
	}
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("reload interval %v must not be negative", c.Interval))
	}
	if len(errs) > 0 {
		return fmt.Errorf("workers file: %w", errors.Join(errs...))
	}
	return nil
}

// Watcher mirrors a static workers file into a Sink, reloading it when its
// contents change. Polling keeps it working on every filesystem, including
// Kubernetes ConfigMap mounts that swap a symlink. A file that stops
// parsing is reported once and the previous fleet stays.
type Watcher struct {
	cfg    Config
	first  []fleet.Worker // the file as New read it, applied first by Run
	synced chan struct{}

	// Owned by Run's goroutine.
	sink  fleet.Sink
	last  []byte
	known map[string]fleet.Worker
}

// New checks cfg and reads the file once: a file that cannot be read or
// parsed is an error here, since the router would have no fleet.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	fw := &Watcher{cfg: cfg, synced: make(chan struct{}), known: map[string]fleet.Worker{}}
	data, err := os.ReadFile(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("workers file: %w", err)
	}
	if fw.first, err = Parse(data, cfg.Policy); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	fw.last = data
	return fw, nil
}

var _ discovery.Source = (*Watcher)(nil)

// Synced is closed once Run has applied the file New read.
func (fw *Watcher) Synced() <-chan struct{} { return fw.synced }

// FlapGrace is zero: a worker taken out of the file is gone.
func (*Watcher) FlapGrace() time.Duration { return 0 }

// Run applies the file, then re-checks it every Interval until ctx ends.
// A change that does not parse goes to obs.BadRecord with the path.
func (fw *Watcher) Run(ctx context.Context, sink fleet.Sink, obs discovery.Observer) error {
	if obs == nil {
		obs = discovery.NopObserver{}
	}
	fw.sink = sink
	fw.apply(fw.first)
	close(fw.synced)
	t := time.NewTicker(fw.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			changed, err := fw.reload()
			if err != nil {
				fw.cfg.Logger.Warn("workers file not reloaded; keeping the previous fleet", "path", fw.cfg.Path, "err", err)
				obs.BadRecord(fw.cfg.Path, err)
			} else if changed {
				fw.cfg.Logger.Info("workers file reloaded", "path", fw.cfg.Path, "workers", len(fw.known))
			}
		}
	}
}

// reload applies the file if its bytes changed since the last good load.
func (fw *Watcher) reload() (bool, error) {
	data, err := os.ReadFile(fw.cfg.Path)
	if err != nil {
		return false, fmt.Errorf("workers file: %w", err)
	}
	if fw.last != nil && bytes.Equal(data, fw.last) {
		return false, nil
	}
	recs, err := Parse(data, fw.cfg.Policy)
	fw.last = data // a bad file is reported once, not every tick
	if err != nil {
		return false, fmt.Errorf("%s: %w", fw.cfg.Path, err)
	}
	fw.apply(recs)
	return true, nil
}

// apply makes the Sink hold exactly recs.
func (fw *Watcher) apply(recs []fleet.Worker) {
	next := make(map[string]fleet.Worker, len(recs))
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
}
