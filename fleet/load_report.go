package fleet

import "time"

// LoadReport is what a worker (or its bridge) publishes at least every
// 250 ms; see docs/architecture.md §3.3. Its subject and codec are in
// bus.
type LoadReport struct {
	// TSMillis is the publisher's wall clock in Unix milliseconds.
	TSMillis      int64 `json:"ts_ms"`
	Waiting       int   `json:"waiting"`
	Running       int   `json:"running"`
	KVUsedBlocks  int   `json:"kv_used_blocks"`
	KVTotalBlocks int   `json:"kv_total_blocks"`
	// KVEventBatches is how many KV event batches the worker's publisher
	// has numbered so far (Kvroute-Seq 0 … n−1, lost ones included), so a
	// router notices a lost batch at the next report even when the worker
	// publishes nothing after it. 0 (omitted): none yet, or not tracked.
	KVEventBatches uint64 `json:"kv_event_batches,omitempty"`
}

// Time returns the report's timestamp.
func (r LoadReport) Time() time.Time { return time.UnixMilli(r.TSMillis) }
