package scoring

import (
	"encoding/json"
	"fmt"
	"time"
)

// LoadReport is what a worker (or its bridge) publishes on LoadSubject at
// least every 250 ms; see DESIGN 3.2.
type LoadReport struct {
	// TSMillis is the publisher's wall clock in Unix milliseconds.
	TSMillis      int64 `json:"ts_ms"`
	Waiting       int   `json:"waiting"`
	Running       int   `json:"running"`
	KVUsedBlocks  int   `json:"kv_used_blocks"`
	KVTotalBlocks int   `json:"kv_total_blocks"`
}

// LoadSubject returns the NATS subject a worker's load reports go to.
func LoadSubject(namespace, workerID string) string {
	return "kvroute." + namespace + ".load." + workerID
}

// LoadSubjectWildcard returns the subject that matches every worker's reports.
func LoadSubjectWildcard(namespace string) string {
	return "kvroute." + namespace + ".load.>"
}

// Time returns the report's timestamp.
func (r LoadReport) Time() time.Time { return time.UnixMilli(r.TSMillis) }

// ParseLoadReport decodes and validates a JSON load report.
func ParseLoadReport(data []byte) (LoadReport, error) {
	var r LoadReport
	if err := json.Unmarshal(data, &r); err != nil {
		return LoadReport{}, fmt.Errorf("load report: %w", err)
	}
	if r.Waiting < 0 || r.Running < 0 || r.KVUsedBlocks < 0 || r.KVTotalBlocks < 0 {
		return LoadReport{}, fmt.Errorf("load report: negative counts (waiting=%d running=%d kv_used_blocks=%d kv_total_blocks=%d)",
			r.Waiting, r.Running, r.KVUsedBlocks, r.KVTotalBlocks)
	}
	if r.KVTotalBlocks > 0 && r.KVUsedBlocks > r.KVTotalBlocks {
		return LoadReport{}, fmt.Errorf("load report: kv_used_blocks %d exceeds kv_total_blocks %d", r.KVUsedBlocks, r.KVTotalBlocks)
	}
	return r, nil
}
