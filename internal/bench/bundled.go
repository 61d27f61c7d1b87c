package bench

import (
	"bytes"
	_ "embed"
)

// bundledTrace is the first 3,894 requests (≤ 1 MB, 1,266 s) of the Mooncake
// conversation trace, shipped so that the demo needs no download.
//
//go:embed testdata/conversation_trace_head.jsonl
var bundledTrace []byte

// BundledTraceName names the bundled trace in reports.
const BundledTraceName = "mooncake conversation_trace.jsonl, first 3894 requests (bundled)"

// BundledTrace returns the bundled Mooncake conversation trace slice.
func BundledTrace() ([]TraceRecord, error) {
	return ReadTrace(bytes.NewReader(bundledTrace), DefaultTraceBlockSize)
}
