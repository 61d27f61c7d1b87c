package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvroute/kvroute/fleet"
)

// writeWorkersFile writes the fleet's records as a static workers file
// ({"workers": [...]}, JSON, which the router's YAML reader accepts), so a
// router without etcd can find the workers. The file is replaced
// atomically.
func writeWorkersFile(path string, recs []fleet.Worker) error {
	data, err := json.MarshalIndent(struct {
		Workers []fleet.Worker `json:"workers"`
	}{recs}, "", "  ")
	if err != nil {
		return fmt.Errorf("workers file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".kvsim-workers-*")
	if err != nil {
		return fmt.Errorf("workers file: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("workers file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("workers file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("workers file: %w", err)
	}
	return nil
}
