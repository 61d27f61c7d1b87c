package bus

import (
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/fleet"
)

// ParseLoadReport decodes and validates a JSON load report.
func ParseLoadReport(data []byte) (fleet.LoadReport, error) {
	var r fleet.LoadReport
	if err := json.Unmarshal(data, &r); err != nil {
		return fleet.LoadReport{}, fmt.Errorf("load report: %w", err)
	}
	if r.Waiting < 0 || r.Running < 0 || r.KVUsedBlocks < 0 || r.KVTotalBlocks < 0 {
		return fleet.LoadReport{}, fmt.Errorf("load report: negative counts (waiting=%d running=%d kv_used_blocks=%d kv_total_blocks=%d)",
			r.Waiting, r.Running, r.KVUsedBlocks, r.KVTotalBlocks)
	}
	if r.KVTotalBlocks > 0 && r.KVUsedBlocks > r.KVTotalBlocks {
		return fleet.LoadReport{}, fmt.Errorf("load report: kv_used_blocks %d exceeds kv_total_blocks %d", r.KVUsedBlocks, r.KVTotalBlocks)
	}
	return r, nil
}

// ParseSyncEvent decodes and validates a replica sync message.
func ParseSyncEvent(data []byte) (fleet.SyncEvent, error) {
	var ev fleet.SyncEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return fleet.SyncEvent{}, fmt.Errorf("sync event: %w", err)
	}
	if err := ev.Validate(); err != nil {
		return fleet.SyncEvent{}, fmt.Errorf("sync event: %w", err)
	}
	return ev, nil
}
