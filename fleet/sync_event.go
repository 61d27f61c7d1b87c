package fleet

import (
	"errors"
	"fmt"
	"strings"
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
