package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// storeLock holds an exclusive lock on a JetStream store directory for as
// long as the embedded NATS server uses it. Two NATS servers sharing one
// store would both write its files; nats-server itself does not refuse
// that, so a second kvroute on the same directory stops at start instead.
type storeLock struct{ f *os.File }

// lockStoreDir creates dir if needed and takes the lock file inside it,
// failing at once, with an error naming the directory, when another
// process holds it.
func lockStoreDir(dir string) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("jetstream store %s: %w", dir, err)
	}
	path := filepath.Join(dir, "kvroute.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("jetstream store %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("jetstream store %s is in use by another process (an embedded NATS server of another kvroute?); give each its own --jetstream-dir", dir)
		}
		return nil, fmt.Errorf("jetstream store %s: lock %s: %w", dir, path, err)
	}
	return &storeLock{f: f}, nil
}

// release drops the lock; nil-safe.
func (l *storeLock) release() {
	if l == nil {
		return
	}
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	_ = l.f.Close()
}
