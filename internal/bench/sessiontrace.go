package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"
)

// SessionRow is one JSON line of a Mooncake trace with sessions, the form
// NVIDIA Dynamo's trace replay reads as trace_format "mooncake": a plain
// Mooncake record, optionally with a session_id. Rows of one session are
// its turns, in file order. Its first turn arrives at timestamp; each later
// turn arrives delay milliseconds after the turn before it finished (when
// delay is absent, the gap between the two rows' timestamps). A row without
// a session_id is a session of one request.
type SessionRow struct {
	SessionID    string   `json:"session_id,omitempty"`
	Timestamp    *float64 `json:"timestamp,omitempty"`
	Delay        *float64 `json:"delay,omitempty"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// TraceSession is a session of a trace: its first turn's arrival and its
// turns in order.
type TraceSession struct {
	ID    string
	Start time.Duration
	Turns []SessionTurn
}

// SessionTurn is one request of a TraceSession. Delay is the pause between
// the previous turn's end and this turn's arrival (0 for a first turn).
// HashIDs stand for the turn's whole prompt, or in the delta form for the
// tokens appended to the session's history.
type SessionTurn struct {
	Delay        time.Duration
	InputLength  int
	OutputLength int
	HashIDs      []int64
}

// maxTraceMillis bounds timestamps and delays (about 31 years) so they
// convert to a time.Duration without overflow.
const maxTraceMillis = 1e12

// ParseSessionRow decodes and checks one JSON line of a session trace
// against blockSize tokens per hash id.
func ParseSessionRow(line []byte, blockSize int) (SessionRow, error) {
	var r SessionRow
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&r); err != nil {
		return SessionRow{}, fmt.Errorf("trace row: %w", err)
	}
	if dec.More() {
		return SessionRow{}, errors.New("trace row: more than one JSON value on the line")
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"timestamp", r.Timestamp}, {"delay", r.Delay}} {
		if f.v != nil && !(*f.v >= 0 && *f.v <= maxTraceMillis) {
			return SessionRow{}, fmt.Errorf("trace row: %s %g must be between 0 and %g ms", f.name, *f.v, float64(maxTraceMillis))
		}
	}
	switch {
	case r.InputLength <= 0:
		return SessionRow{}, fmt.Errorf("trace row: input_length %d must be positive", r.InputLength)
	case r.OutputLength <= 0:
		return SessionRow{}, fmt.Errorf("trace row: output_length %d must be positive", r.OutputLength)
	case len(r.HashIDs) == 0:
		return SessionRow{}, errors.New("trace row: no hash_ids")
	}
	if slices.ContainsFunc(r.HashIDs, func(h int64) bool { return h < 0 }) {
		return SessionRow{}, errors.New("trace row: negative hash id")
	}
	if want := (r.InputLength + blockSize - 1) / blockSize; len(r.HashIDs) != want {
		return SessionRow{}, fmt.Errorf("trace row: %d hash_ids for input_length %d, want %d at %d tokens per block",
			len(r.HashIDs), r.InputLength, want, blockSize)
	}
	return r, nil
}

// ReadSessionTrace reads a Mooncake JSONL trace whose rows may carry
// session_id and delay (see SessionRow). A plain Mooncake trace reads as
// one single-turn session per row. Sessions are returned in order of their
// first turn's arrival (ties in file order), relative to the earliest; any
// bad line is an error naming its line number.
func ReadSessionTrace(r io.Reader, blockSize int) ([]TraceSession, error) {
	if blockSize <= 0 {
		blockSize = DefaultTraceBlockSize
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	var (
		out    []TraceSession
		byID   = map[string]int{}
		lastTS []float64 // per session: the latest row timestamp, or NaN
	)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		row, err := ParseSessionRow(line, blockSize)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		turn := SessionTurn{InputLength: row.InputLength, OutputLength: row.OutputLength, HashIDs: row.HashIDs}
		s, seen := byID[row.SessionID]
		if row.SessionID == "" || !seen {
			if row.Timestamp == nil {
				return nil, fmt.Errorf("line %d: the first turn of a session needs a timestamp", n)
			}
			if row.Delay != nil && *row.Delay != 0 {
				return nil, fmt.Errorf("line %d: delay on the first turn of a session", n)
			}
			if row.SessionID != "" {
				byID[row.SessionID] = len(out)
			}
			out = append(out, TraceSession{ID: row.SessionID, Start: millis(*row.Timestamp), Turns: []SessionTurn{turn}})
			lastTS = append(lastTS, *row.Timestamp)
			continue
		}
		switch {
		case row.Delay != nil:
			turn.Delay = millis(*row.Delay)
		case row.Timestamp != nil:
			if math.IsNaN(lastTS[s]) || *row.Timestamp < lastTS[s] {
				return nil, fmt.Errorf("line %d: turn of session %q has no delay and its timestamp does not follow the turn before", n, row.SessionID)
			}
			turn.Delay = millis(*row.Timestamp - lastTS[s])
		}
		if row.Timestamp != nil {
			lastTS[s] = *row.Timestamp
		} else {
			lastTS[s] = math.NaN()
		}
		out[s].Turns = append(out[s].Turns, turn)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("read trace: no records")
	}
	slices.SortStableFunc(out, func(a, b TraceSession) int { return cmp.Compare(a.Start, b.Start) })
	t0 := out[0].Start
	for i := range out {
		out[i].Start -= t0
	}
	return out, nil
}

// ReadSessionTraceFile is ReadSessionTrace for a file.
func ReadSessionTraceFile(path string, blockSize int) ([]TraceSession, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer func() { _ = f.Close() }()
	s, err := ReadSessionTrace(f, blockSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// WriteSessionTrace writes sessions as Mooncake JSONL, session after
// session: the first turn with its timestamp, later turns with their delay,
// in whole milliseconds. A session without an ID is named by its position
// (s0, s1, ...).
func WriteSessionTrace(w io.Writer, sessions []TraceSession) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	used := map[string]bool{}
	for _, s := range sessions {
		used[s.ID] = true
	}
	for i, s := range sessions {
		id := s.ID
		if id == "" {
			// Unnamed sessions need names of their own, or rows of two
			// would read back as one session.
			for id = fmt.Sprintf("s%d", i); used[id]; id = "_" + id {
			}
			used[id] = true
		}
		for k, t := range s.Turns {
			row := SessionRow{SessionID: id, InputLength: t.InputLength, OutputLength: t.OutputLength, HashIDs: t.HashIDs}
			if k == 0 {
				ts := float64(s.Start.Round(time.Millisecond).Milliseconds())
				row.Timestamp = &ts
			} else {
				d := float64(t.Delay.Round(time.Millisecond).Milliseconds())
				row.Delay = &d
			}
			if err := enc.Encode(row); err != nil {
				return fmt.Errorf("write trace: %w", err)
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	return nil
}

func millis(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}
