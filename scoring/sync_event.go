package scoring

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Lifecycle operations carried by a SyncEvent.
const (
	OpAdd         = "add"
	OpPrefillDone = "prefill_done"
	OpProgress    = "progress"
	OpFree        = "free"
	OpMove        = "move"
	// OpReset tells peers to drop every request of the sending router; a
	// replica sends it when it starts, so a restart does not leave its old
	// load behind on its peers.
	OpReset = "reset"
	// OpHeartbeat says the sending router is alive; peers drop its load
	// when they miss MissedHeartbeats of them in a row. IntervalMS is its
	// period and Incarnation tells two processes under one router ID apart.
	OpHeartbeat = "heartbeat"
)

// MissedHeartbeats is how many heartbeat periods of silence make peers
// drop a router's in-flight load.
const MissedHeartbeats = 3

// maxSyncHashes bounds the hashes one add event may carry (a 1M-token
// prompt at block size 16 has 65 536 blocks).
const maxSyncHashes = 1 << 17

// SyncEvent is one lifecycle event shared between router replicas; its
// subject and codec (JSON) are in bus.
type SyncEvent struct {
	// Router is the sending replica's ID.
	Router string `json:"router"`
	// Op is one of the Op* constants.
	Op string `json:"op"`
	// ID is the request ID, unique within the sending router.
	ID string `json:"id,omitempty"`
	// Worker is the chosen worker, for add and move.
	Worker string `json:"worker,omitempty"`
	// PromptTokens and PrefillTokens size an added request.
	PromptTokens  int `json:"prompt_tokens,omitempty"`
	PrefillTokens int `json:"prefill_tokens,omitempty"`
	// OutputTokens is the output so far, for progress.
	OutputTokens int `json:"output_tokens,omitempty"`
	// Hashes are the prompt's block hashes, for add.
	Hashes []uint64 `json:"hashes,omitempty"`
	// IntervalMS is the sender's heartbeat period, for heartbeat.
	IntervalMS int64 `json:"interval_ms,omitempty"`
	// Incarnation is random per process, for heartbeat and reset.
	Incarnation string `json:"incarnation,omitempty"`
}

// Validate reports whether the event is well formed: a known op with the
// fields it needs, no negative counts, a bounded hash list.
func (ev SyncEvent) Validate() error {
	if ev.Router == "" {
		return errors.New("router is empty")
	}
	if strings.ContainsRune(ev.Router, 0) {
		return errors.New("router contains a NUL byte")
	}
	if ev.PromptTokens < 0 || ev.PrefillTokens < 0 || ev.OutputTokens < 0 || ev.IntervalMS < 0 {
		return fmt.Errorf("negative token count (prompt=%d prefill=%d output=%d)", ev.PromptTokens, ev.PrefillTokens, ev.OutputTokens)
	}
	if len(ev.Hashes) > maxSyncHashes {
		return fmt.Errorf("%d hashes exceed the limit of %d", len(ev.Hashes), maxSyncHashes)
	}
	switch ev.Op {
	case OpReset:
		return nil
	case OpHeartbeat:
		if ev.IntervalMS <= 0 {
			return errors.New("heartbeat without a positive interval_ms")
		}
		return nil
	case OpAdd, OpMove:
		if ev.Worker == "" {
			return fmt.Errorf("op %s without a worker", ev.Op)
		}
	case OpPrefillDone, OpProgress, OpFree:
	default:
		return fmt.Errorf("unknown op %q", ev.Op)
	}
	if ev.ID == "" {
		return fmt.Errorf("op %s without a request id", ev.Op)
	}
	return nil
}

// peerKey names a peer's request inside the pool, apart from local IDs.
func peerKey(router, id string) string { return router + "\x00" + id }

// Apply applies a peer replica's lifecycle event to the pool, so the peer's
// in-flight load counts like local load. It never re-publishes. Events for
// workers this replica does not know are ignored with an error.
func (p *Pool) Apply(ev SyncEvent) error {
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("apply sync event: %w", err)
	}
	key := peerKey(ev.Router, ev.ID)
	switch ev.Op {
	case OpAdd:
		if _, err := p.add(key, ev.Worker, ev.PromptTokens, 0, ev.PrefillTokens, ev.Hashes, 0, false); err != nil {
			return fmt.Errorf("apply sync event from %q: %w", ev.Router, err)
		}
	case OpPrefillDone:
		if p.prefillDone(key) {
			p.capacityChanged()
		}
	case OpProgress:
		if _, done := p.progress(key, ev.OutputTokens); done {
			p.capacityChanged()
		}
	case OpFree:
		if p.free(key) {
			p.capacityChanged()
		}
	case OpMove:
		moved, err := p.move(key, ev.Worker)
		if err != nil {
			return fmt.Errorf("apply sync event from %q: %w", ev.Router, err)
		}
		if moved {
			p.capacityChanged()
		}
	case OpReset:
		if p.resetPeer(ev.Router) > 0 {
			p.capacityChanged()
		}
	case OpHeartbeat:
		// Liveness is tracked by the sync adapter (bus), which
		// calls DropPeer when a router falls silent.
	}
	return nil
}

// DropPeer drops every in-flight request a peer router added, for when the
// peer fell silent (missed heartbeats) and is presumed dead. It returns how
// many requests it dropped.
func (p *Pool) DropPeer(router string) int {
	n := p.resetPeer(router)
	if n > 0 {
		p.capacityChanged()
	}
	return n
}

// phantomGrace is how old a peer's request must be before a worker's idle
// load report may clear it: younger ones may not have reached the worker
// when the report was taken.
const phantomGrace = time.Second

// clearPhantomsLocked drops the peer requests on w older than phantomGrace,
// after w reported nothing running or waiting: a peer that died or lost a
// Free left them behind. Local requests are left to their streams.
func (p *Pool) clearPhantomsLocked(w *worker, now time.Time) int {
	if w.requests == 0 {
		return 0
	}
	n := 0
	for key, a := range p.reqs {
		if a.w != w || !strings.Contains(key, "\x00") || now.Sub(a.addAt) < phantomGrace {
			continue
		}
		p.releaseLocked(a)
		delete(p.reqs, key)
		p.tomb.add(key)
		n++
	}
	return n
}

// resetPeer drops every request a peer router added.
func (p *Pool) resetPeer(router string) int {
	prefix := router + "\x00"
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for key, a := range p.reqs {
		if strings.HasPrefix(key, prefix) {
			p.releaseLocked(a)
			delete(p.reqs, key)
			n++
		}
	}
	return n
}

// emit hands a local event to the replica sync publisher, if any.
func (p *Pool) emit(ev SyncEvent) {
	if ev.Op == "" {
		return
	}
	if f := p.sink.Load(); f != nil {
		(*f)(ev)
	}
}

// SetSink hands the pool's local lifecycle events to f (the replica sync
// publisher), or to nobody when f is nil. f must not block.
func (p *Pool) SetSink(f func(SyncEvent)) {
	if f == nil {
		p.sink.Store(nil)
		return
	}
	p.sink.Store(&f)
}

// Metrics returns the pool's metrics, for the adapters that feed it.
func (p *Pool) Metrics() Metrics { return p.opts.Metrics }
