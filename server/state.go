package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
)

// The fleet state file keeps the last fleet discovery gave across a
// restart of the router, so that a router restarted while its discovery
// backend (etcd, the Kubernetes API server) is away still knows its
// workers: it routes to them, publishes them over xDS and turns ready,
// instead of answering every request without a worker. The file is read
// once at start, before discovery runs, and its workers are dropped as soon
// as discovery's first full view arrives (the view then is the truth); it
// is rewritten, atomically, after each change once discovery has synced.

// stateVersion is the file format's version; a file of another version
// is ignored.
const stateVersion = 1

// fleetState is the state file's content.
type fleetState struct {
	Version   int    `json:"version"`
	Namespace string `json:"namespace"`
	// Source names the kind of source the fleet came from (etcd,
	// inferencepool); a file written under another kind is ignored.
	Source  string         `json:"source"`
	SavedAt time.Time      `json:"saved_at"`
	Workers []fleet.Worker `json:"workers"`
}

// stateFile is the path of the namespace's state file, or "" when the
// router keeps no state or its source has no backend that can be away (a
// workers file is its own state).
func (r *Server) stateFile() string {
	if r.cfg.Recovery.StateDir == "" || r.src == nil || r.src.kind.dep == "" {
		return ""
	}
	return filepath.Join(r.cfg.Recovery.StateDir, "fleet-"+r.cfg.Namespace+".json")
}

// stateSource names the configured kind of source.
func (r *Server) stateSource() string { return r.src.kind.label }

// restoreFleet puts the state file's workers into the fleet, before
// discovery runs. Records are checked as discovery checks them. A missing
// file is a first start; a bad one is logged and ignored.
func (r *Server) restoreFleet() {
	path := r.stateFile()
	if path == "" {
		return
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var st fleetState
	if err == nil {
		err = json.Unmarshal(data, &st)
	}
	switch {
	case err != nil:
		r.log.Warn("fleet state file unreadable; starting without it", "path", path, "err", err)
		return
	case st.Version != stateVersion || st.Namespace != r.cfg.Namespace || st.Source != r.stateSource():
		r.log.Info("fleet state file is for another version, namespace or source; starting without it", "path", path)
		return
	}
	var recs []fleet.Worker
	for _, w := range st.Workers {
		if err := discovery.ValidateRecordWith(w, r.addressPolicy()); err != nil {
			r.log.Warn("fleet state file: ignoring bad worker record", "path", path, "err", err)
			continue
		}
		recs = append(recs, w)
	}
	if len(recs) == 0 {
		return
	}
	r.fleet.restore(recs)
	r.log.Info("fleet restored from the state file until discovery answers", "path", path, "workers", len(recs), "saved_at", st.SavedAt)
}

// stateListener tells the state writer the fleet changed.
type stateListener struct{ r *Server }

func (l stateListener) Upsert(fleet.Worker) { l.r.notifyState() }
func (l stateListener) Remove(string)       { l.r.notifyState() }

var _ fleet.Sink = stateListener{}

func (r *Server) notifyState() {
	if r.stateChanged == nil {
		return
	}
	select {
	case r.stateChanged <- struct{}{}:
	default:
	}
}

// writeStates rewrites the state file after each fleet change, once
// discovery has synced (before that the fleet holds the restored workers at
// most, which the file already has), until shutdown.
func (r *Server) writeStates() {
	path := r.stateFile()
	var last []fleet.Worker
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.stateChanged:
		}
		if !r.synced.Load() {
			continue // synced notifies again
		}
		recs := r.fleet.snapshot()
		if last != nil && slices.EqualFunc(recs, last, func(a, b fleet.Worker) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
			continue
		}
		st := fleetState{Version: stateVersion, Namespace: r.cfg.Namespace, Source: r.stateSource(), SavedAt: time.Now().UTC(), Workers: recs}
		if err := writeFileAtomic(path, st); err != nil {
			r.log.Warn("fleet state file not written; a restart while discovery is away starts without workers", "path", path, "err", err)
			continue
		}
		last = recs
	}
}

// writeFileAtomic writes v as JSON to path through a temporary file in
// the same directory, synced and renamed over path, so a crash leaves the
// old file or the new one, never a torn one.
func writeFileAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+strings.TrimSuffix(filepath.Base(path), ".json")+"-*.tmp")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // after the rename: nothing there
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // the rename itself durable, where the filesystem allows
		_ = d.Close()
	}
	return nil
}
