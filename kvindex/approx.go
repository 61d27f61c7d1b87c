package kvindex

import (
	"sync"
	"time"
)

// Approx defaults.
const (
	DefaultApproxTTL       = 120 * time.Second
	DefaultApproxMaxBlocks = 1 << 20
	DefaultApproxPruneTo   = 0.8
)

// ApproxConfig tunes an Approx. The zero value gives the defaults.
type ApproxConfig struct {
	TTL       time.Duration    // how long a recorded block is believed; default 120 s
	MaxBlocks int              // (block, worker) pairs kept; default 2^20
	PruneTo   float64          // fraction of MaxBlocks kept after a prune; default 0.8
	Now       func() time.Time // clock; default time.Now
}

// Approx is the index for fleets that publish no KV events: it believes that
// a worker holds the blocks of every prompt the router sent it, for a TTL.
// When it outgrows MaxBlocks it prunes to PruneTo × MaxBlocks, dropping the
// oldest records first and, within a record, its deepest blocks first.
type Approx struct {
	mu  sync.RWMutex
	cfg ApproxConfig
}

// NewApprox returns an empty approximate index.
func NewApprox(cfg ApproxConfig) *Approx {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultApproxTTL
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultApproxMaxBlocks
	}
	if cfg.PruneTo <= 0 || cfg.PruneTo > 1 {
		cfg.PruneTo = DefaultApproxPruneTo
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Approx{cfg: cfg}
}

// Record notes that the router sent a prompt with these block hashes to
// worker, which will therefore hold them.
func (a *Approx) Record(worker string, hashes []uint64) {}

// RemoveWorker forgets worker's records.
func (a *Approx) RemoveWorker(worker string) {}

// Len returns the number of (block, worker) pairs held.
func (a *Approx) Len() int { return 0 }

// Match implements Matcher.
func (a *Approx) Match(hashes []uint64, candidates []string, out []MatchResult) []MatchResult {
	out = out[:0]
	for _, c := range candidates {
		out = append(out, MatchResult{Worker: c})
	}
	return out
}
