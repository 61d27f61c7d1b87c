package bench

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
	"io"
)

// The two Mooncake traces, whole and gzipped, so that simulations of them
// need no download.
var (
	//go:embed testdata/conversation_trace.jsonl.gz
	conversationTraceGz []byte
	//go:embed testdata/synthetic_trace.jsonl.gz
	syntheticTraceGz []byte
)

// TraceNames lists the traces NamedTrace knows.
var TraceNames = []string{"conversation", "synthetic"}

// NamedTrace returns a whole bundled Mooncake trace: "conversation"
// (12,031 requests over 3,537 s) or "synthetic" (3,993 over 1,022 s).
func NamedTrace(name string) ([]TraceRecord, error) {
	var gz []byte
	switch name {
	case "conversation":
		gz = conversationTraceGz
	case "synthetic":
		gz = syntheticTraceGz
	default:
		return nil, fmt.Errorf("no bundled trace %q (have: conversation, synthetic)", name)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("bundled trace %s: %w", name, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("bundled trace %s: %w", name, err)
	}
	return ReadTrace(bytes.NewReader(data), DefaultTraceBlockSize)
}
