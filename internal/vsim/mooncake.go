package vsim

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/kvindex"
)

// Trace formats SessionTraceWorkload reads, named as NVIDIA Dynamo's trace
// replay names them.
const (
	// FormatMooncake: each row's hash_ids spell out the turn's whole prompt.
	FormatMooncake = "mooncake"
	// FormatMooncakeDelta: a later turn's hash_ids are only the tokens it
	// appends to the session's history (the previous prompt and the output
	// generated for it).
	FormatMooncakeDelta = "mooncake-delta"
)

// TraceFormats lists the formats SessionTraceWorkload reads.
var TraceFormats = []string{FormatMooncake, FormatMooncakeDelta}

// SessionTraceWorkload turns the sessions of a Mooncake trace into a
// workload: each session's turns in order, the first at its Start, each
// later one its Delay after the turn before finished. traceBlock is the
// tokens per hash id; format is one of TraceFormats.
func SessionTraceWorkload(name string, sessions []bench.TraceSession, traceBlock int, format string) (*Workload, error) {
	if format != FormatMooncake && format != FormatMooncakeDelta {
		return nil, fmt.Errorf("trace format %q (valid: %s, %s)", format, FormatMooncake, FormatMooncakeDelta)
	}
	w := &Workload{Name: name, TraceBlock: traceBlock, RootIDs: 1, Params: map[string]any{
		"sessions": len(sessions), "trace_block": traceBlock, "trace_format": format,
	}}
	requests := 0
	for _, s := range sessions {
		sess := Session{Start: s.Start}
		for k, t := range s.Turns {
			sess.Turns = append(sess.Turns, Turn{
				Trace: t.HashIDs, Input: t.InputLength, Output: max(t.OutputLength, 1),
				Whole: k > 0 && format == FormatMooncake, Delay: t.Delay,
			})
		}
		requests += len(s.Turns)
		w.Sessions = append(w.Sessions, sess)
	}
	w.Params["records"] = requests
	if n := len(sessions); n > 0 {
		w.Params["trace_seconds"] = sessions[n-1].Start.Seconds()
	}
	return w, nil
}

// MooncakeSessions spells w out as a Mooncake trace with sessions at
// blockSize tokens per hash id, for another simulator to replay (NVIDIA
// Dynamo's trace replay reads it as format "mooncake"): each turn's whole
// prompt, the history included with the output an engine of cfg generates
// for the turn before. Equal ids mean equal content up to and including
// their block (a last, partial block gets an id of its own), so a replay
// at that block size sees the prefix reuse this workload has; hash ids are
// numbered from 0 in order of first use.
func (w *Workload) MooncakeSessions(cfg sim.EngineConfig, blockSize int) ([]bench.TraceSession, error) {
	if blockSize < 1 {
		return nil, fmt.Errorf("export block size %d must be positive", blockSize)
	}
	ids := map[uint64]int64{}
	seed := kvindex.Seed("mooncake-export", "", "")
	var (
		hist   []int32
		tok32  []uint32
		hashes []uint64
		out    = make([]bench.TraceSession, 0, len(w.Sessions))
	)
	for s := range w.Sessions {
		sess := &w.Sessions[s]
		ts := bench.TraceSession{ID: fmt.Sprintf("s%d", s), Start: sess.Start}
		hist = hist[:0]
		for k := range sess.Turns {
			t := &sess.Turns[k]
			hist = w.appendPrompt(hist, t)
			tok32 = tok32[:0]
			for _, x := range hist {
				tok32 = append(tok32, uint32(x))
			}
			hashes = kvindex.HashBlocks(seed, tok32, blockSize, hashes[:0])
			if full := len(hashes) * blockSize; full < len(tok32) {
				parent := seed
				if len(hashes) > 0 {
					parent = hashes[len(hashes)-1]
				}
				// A partial block hashes as a block of its own length,
				// marked so it never equals a full block.
				tail := kvindex.HashBlocks(parent, tok32[full:], len(tok32)-full, nil)
				hashes = append(hashes, tail[0]^0x9e3779b97f4a7c15)
			}
			turn := bench.SessionTurn{InputLength: len(hist), OutputLength: t.Output, HashIDs: make([]int64, len(hashes))}
			for i, h := range hashes {
				id, ok := ids[h]
				if !ok {
					id = int64(len(ids))
					ids[h] = id
				}
				turn.HashIDs[i] = id
			}
			if k > 0 {
				turn.Delay = sess.Think + t.Delay
			}
			ts.Turns = append(ts.Turns, turn)
			if k+1 < len(sess.Turns) {
				hist = sim.AppendGenerated(cfg, hist, t.Output, hist)
			}
		}
		out = append(out, ts)
	}
	return out, nil
}
