package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// TraceRecord is one request of a Mooncake-format trace: arrival time in
// milliseconds, prompt and output lengths in tokens, and one hash id per
// block of the prompt (equal ids mean an identical prefix up to that block).
type TraceRecord struct {
	Timestamp    int64   `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// DefaultTraceBlockSize is the Mooncake traces' tokens per hash id.
const DefaultTraceBlockSize = 512

// maxTraceLine bounds one JSONL line (a 1M-token prompt has ~2k ids).
const maxTraceLine = 4 << 20

// ParseTraceRecord decodes and checks one JSON line of a trace against
// blockSize tokens per hash id.
func ParseTraceRecord(line []byte, blockSize int) (TraceRecord, error) {
	var r TraceRecord
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&r); err != nil {
		return TraceRecord{}, fmt.Errorf("trace record: %w", err)
	}
	switch {
	case r.Timestamp < 0:
		return TraceRecord{}, fmt.Errorf("trace record: negative timestamp %d", r.Timestamp)
	case r.InputLength <= 0:
		return TraceRecord{}, fmt.Errorf("trace record: input_length %d must be positive", r.InputLength)
	case r.OutputLength <= 0:
		return TraceRecord{}, fmt.Errorf("trace record: output_length %d must be positive", r.OutputLength)
	case len(r.HashIDs) == 0:
		return TraceRecord{}, errors.New("trace record: no hash_ids")
	}
	// Mooncake guarantees len(hash_ids) == ceil(input_length / block).
	if want := (r.InputLength + blockSize - 1) / blockSize; len(r.HashIDs) != want {
		return TraceRecord{}, fmt.Errorf("trace record: %d hash_ids for input_length %d, want %d at %d tokens per block",
			len(r.HashIDs), r.InputLength, want, blockSize)
	}
	return r, nil
}

// ReadTrace reads a Mooncake-format JSONL trace. Blank lines are skipped;
// any bad line is an error naming its line number. Records are returned in
// file order; timestamps must not decrease.
func ReadTrace(r io.Reader, blockSize int) ([]TraceRecord, error) {
	if blockSize <= 0 {
		blockSize = DefaultTraceBlockSize
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	var out []TraceRecord
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		rec, err := ParseTraceRecord(line, blockSize)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(out) > 0 && rec.Timestamp < out[len(out)-1].Timestamp {
			return nil, fmt.Errorf("line %d: timestamp %d goes back in time", n, rec.Timestamp)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("read trace: no records")
	}
	return out, nil
}

// ReadTraceFile is ReadTrace for a file.
func ReadTraceFile(path string, blockSize int) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer func() { _ = f.Close() }()
	recs, err := ReadTrace(f, blockSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// Token ids of synthesized prompts lie in [tokenBase, tokenBase+tokenSpan):
// above byte-level and special ids, inside a 32k vocabulary.
const (
	tokenBase = 256
	tokenSpan = 32000 - tokenBase
)

// BlockTokens appends the n tokens that stand for hash id h: deterministic,
// so equal ids give equal tokens and different ids (almost surely) differ
// from their first token on.
func BlockTokens(dst []int32, h int64, n int) []int32 {
	x := uint64(h)*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
	for i := 0; i < n; i++ {
		x += 0x9E3779B97F4A7C15
		z := x
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		dst = append(dst, int32(tokenBase+z%tokenSpan))
	}
	return dst
}

// TracePrompt builds the prompt of a record: one block of blockSize tokens
// per hash id, the last one cut so the prompt is InputLength long.
func TracePrompt(r TraceRecord, blockSize int) []int32 {
	out := make([]int32, 0, r.InputLength)
	for i, h := range r.HashIDs {
		n := min(blockSize, r.InputLength-i*blockSize)
		if n <= 0 {
			break
		}
		out = BlockTokens(out, h, n)
	}
	return out
}
