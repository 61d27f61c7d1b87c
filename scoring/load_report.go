package scoring

import "time"

// LoadReport is what a worker (or its bridge) publishes at least every
// 250 ms; see docs/architecture.md §3.3. Its subject and codec are in
// internal/bus.
type LoadReport struct {
	// TSMillis is the publisher's wall clock in Unix milliseconds.
	TSMillis      int64 `json:"ts_ms"`
	Waiting       int   `json:"waiting"`
	Running       int   `json:"running"`
	KVUsedBlocks  int   `json:"kv_used_blocks"`
	KVTotalBlocks int   `json:"kv_total_blocks"`
}

// Time returns the report's timestamp.
func (r LoadReport) Time() time.Time { return time.UnixMilli(r.TSMillis) }
