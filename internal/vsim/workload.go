package vsim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
)

// Workload is what a simulation replays: sessions of turns. A session's
// first turn arrives at Start (divided by the load multiplier); each later
// turn arrives Think plus its own Delay after the previous one finished
// (divided likewise), and its prompt is the previous prompt, the tokens the
// engine generated for it, and the turn's own tokens, as a chat client or
// an agent re-sends its history; a Whole turn's prompt is its own tokens
// alone (a trace that spells out each turn's whole prompt).
//
// Prompts are built when a turn is sent, never all at once: the whole
// Mooncake conversation trace would take over half a gigabyte of tokens.
type Workload struct {
	// Name says what it is; Params describe it in reports.
	Name   string
	Params map[string]any
	// Sessions in order of Start.
	Sessions []Session
	// TraceBlock is the tokens per hash id of trace turns (Mooncake: 512).
	TraceBlock int
	// RootIDs is how many leading hash ids every trace turn may share
	// without being a follow-up of another (the conversation trace's
	// common system prompt): stickiness links a turn to an earlier one
	// only when they share more.
	RootIDs int
}

// Session is one client: a single trace request, or a conversation.
type Session struct {
	Start time.Duration
	Think time.Duration
	Turns []Turn
}

// Turn is one request of a session.
type Turn struct {
	// Trace, for a trace record, lists its hash ids: Input tokens,
	// TraceBlock tokens per id, appended to the history.
	Trace []int64
	Input int
	// New tokens, drawn deterministically from Seed, follow them.
	New  int
	Seed uint64
	// Output is the number of tokens generated (max_tokens, ignore_eos).
	Output int
	// Whole drops the history: the turn's prompt is its own tokens only.
	Whole bool
	// Delay is added to the session's Think before this turn (not the
	// first) arrives.
	Delay time.Duration
}

// Requests counts the turns of all sessions.
func (w *Workload) Requests() int {
	n := 0
	for i := range w.Sessions {
		n += len(w.Sessions[i].Turns)
	}
	return n
}

// appendPrompt appends turn t's prompt to history (the previous turn's
// prompt and output, nil for a first turn), or for a Whole turn writes it
// over history, and returns it.
func (w *Workload) appendPrompt(history []int32, t *Turn) []int32 {
	if t.Whole {
		history = history[:0]
	}
	if t.Trace != nil {
		history = slices.Grow(history, t.Input)
		for i, h := range t.Trace {
			n := min(w.TraceBlock, t.Input-i*w.TraceBlock)
			if n <= 0 {
				break
			}
			history = bench.BlockTokens(history, h, n)
		}
	}
	if t.New > 0 {
		history = slices.Grow(history, t.New)
		history = bench.BlockTokens(history, int64(t.Seed), t.New)
	}
	return history
}

// Prompts calls fn with every prompt in nominal arrival order (session
// starts, then turns spaced by think time, ignoring service time), with
// the outputs an engine with cfg generates: the order the reference hit
// rates replay. fn must not keep the slice.
func (w *Workload) Prompts(cfg sim.EngineConfig, fn func(prompt []int32)) {
	type cursor struct {
		s    int
		turn int
		at   time.Duration
		hist []int32
	}
	var live []*cursor
	next := 0
	for next < len(w.Sessions) || len(live) > 0 {
		// The earliest of the next session start and the live sessions' next turns.
		best := -1
		for i, c := range live {
			if best < 0 || c.at < live[best].at {
				best = i
			}
		}
		if next < len(w.Sessions) && (best < 0 || w.Sessions[next].Start <= live[best].at) {
			live = append(live, &cursor{s: next, at: w.Sessions[next].Start})
			next++
			continue
		}
		c := live[best]
		s := &w.Sessions[c.s]
		t := &s.Turns[c.turn]
		c.hist = w.appendPrompt(c.hist, t)
		fn(c.hist)
		c.turn++
		if c.turn == len(s.Turns) {
			live = slices.Delete(live, best, best+1)
			continue
		}
		c.hist = sim.AppendGenerated(cfg, c.hist, t.Output, c.hist)
		c.at += s.Think + s.Turns[c.turn].Delay
	}
}

// TraceWorkload turns Mooncake records into single-turn sessions at their
// timestamps, relative to the first.
func TraceWorkload(name string, recs []bench.TraceRecord, traceBlock int) *Workload {
	w := &Workload{Name: name, TraceBlock: traceBlock, RootIDs: 1, Params: map[string]any{"records": len(recs), "trace_block": traceBlock}}
	if len(recs) == 0 {
		return w
	}
	t0 := recs[0].Timestamp
	for _, r := range recs {
		w.Sessions = append(w.Sessions, Session{
			Start: time.Duration(r.Timestamp-t0) * time.Millisecond,
			Turns: []Turn{{Trace: r.HashIDs, Input: r.InputLength, Output: max(r.OutputLength, 1)}},
		})
	}
	w.Params["trace_seconds"] = float64(recs[len(recs)-1].Timestamp-t0) / 1000
	return w
}

// AgentOptions shapes the multi-turn agent workload: sessions that share
// one of a few long system prompts and, turn after turn, append a tool
// result and receive a short answer, as a coding or tool-use agent does.
type AgentOptions struct {
	Sessions int
	// Turns per session, drawn uniformly from [MinTurns, MaxTurns].
	MinTurns, MaxTurns int
	// SystemPrompts distinct system prompts of SystemTokens tokens.
	SystemPrompts, SystemTokens int
	// FirstTokens is the first user message; Tool tokens, drawn uniformly
	// from [MinTool, MaxTool], are appended each later turn.
	FirstTokens      int
	MinTool, MaxTool int
	// Output tokens per turn, drawn uniformly from [MinOutput, MaxOutput].
	MinOutput, MaxOutput int
	// Rate is new sessions per second (Poisson) at load 1.
	Rate float64
	// Burst, when positive, replaces Rate: every session starts at a
	// uniformly random instant within the first Burst (at load 1), as when
	// a batch of clients connects at once.
	Burst time.Duration
	// Think is the pause between an answer and the next turn at load 1.
	Think time.Duration
	Seed  uint64
}

// DefaultAgentOptions is the agent workload docs/routing.md's figures use:
// 1,000 sessions of 4–16 turns over eight 4k-token system prompts, about
// 9.8k requests whose reuse fits in an 8-worker fleet's cache.
func DefaultAgentOptions() AgentOptions {
	return AgentOptions{
		Sessions: 1000, MinTurns: 4, MaxTurns: 16,
		SystemPrompts: 8, SystemTokens: 4000, FirstTokens: 400,
		MinTool: 300, MaxTool: 2000, MinOutput: 20, MaxOutput: 120,
		Rate: 1.0, Think: 3 * time.Second, Seed: 1,
	}
}

// DefaultBurstOptions is the burst workload: 40 chat sessions of 4 turns
// over six 1.9k-token system prompts, all starting within 200 ms, 16
// output tokens a turn and 250 ms of think time. Sessions that share a
// system prompt arrive before any engine has stored it, so a router that
// learns only from KV events cannot know where the first of them went.
func DefaultBurstOptions() AgentOptions {
	return AgentOptions{
		Sessions: 40, MinTurns: 4, MaxTurns: 4,
		SystemPrompts: 6, SystemTokens: 1900, FirstTokens: 60,
		MinTool: 40, MaxTool: 80, MinOutput: 16, MaxOutput: 16,
		Burst: 200 * time.Millisecond, Think: 250 * time.Millisecond, Seed: 4,
	}
}

// AgentWorkload builds the agent workload.
func AgentWorkload(o AgentOptions) (*Workload, error) {
	return agentWorkload("agent", o)
}

// BurstWorkload builds the burst workload: agent sessions whose starts
// fall within o.Burst.
func BurstWorkload(o AgentOptions) (*Workload, error) {
	if o.Burst <= 0 {
		return nil, fmt.Errorf("burst workload: window %s must be positive", o.Burst)
	}
	return agentWorkload("burst", o)
}

func agentWorkload(name string, o AgentOptions) (*Workload, error) {
	if o.Sessions < 1 || o.MinTurns < 1 || o.MaxTurns < o.MinTurns || o.SystemPrompts < 1 ||
		o.MaxTool < o.MinTool || o.MinOutput < 1 || o.MaxOutput < o.MinOutput || !(o.Rate > 0 || o.Burst > 0) {
		return nil, fmt.Errorf("%s workload: inconsistent options %+v", name, o)
	}
	r := rand.New(rand.NewPCG(o.Seed, 0xa9e47))
	w := &Workload{Name: name, TraceBlock: 1, Params: map[string]any{
		"sessions": o.Sessions, "turns": fmt.Sprintf("%d-%d", o.MinTurns, o.MaxTurns),
		"system_prompts": o.SystemPrompts, "system_tokens": o.SystemTokens,
		"tool_tokens": fmt.Sprintf("%d-%d", o.MinTool, o.MaxTool), "output_tokens": fmt.Sprintf("%d-%d", o.MinOutput, o.MaxOutput),
		"think_ms": o.Think.Milliseconds(),
	}}
	if o.Burst > 0 {
		w.Params["first_tokens"], w.Params["burst_ms"] = o.FirstTokens, o.Burst.Milliseconds()
	} else {
		w.Params["sessions_per_second"] = o.Rate
	}
	// Burst starts come from a stream of their own, sorted, since sessions
	// are in order of Start; Poisson starts are drawn as the sessions are.
	var starts []time.Duration
	if o.Burst > 0 {
		br := rand.New(rand.NewPCG(o.Seed, 0xb0257))
		for range o.Sessions {
			starts = append(starts, time.Duration(br.Int64N(int64(o.Burst))))
		}
		slices.Sort(starts)
	}
	var at time.Duration
	for s := 0; s < o.Sessions; s++ {
		if starts != nil {
			at = starts[s]
		} else {
			at += time.Duration(r.ExpFloat64() / o.Rate * float64(time.Second))
		}
		n := o.MinTurns + r.IntN(o.MaxTurns-o.MinTurns+1)
		sess := Session{Start: at, Think: o.Think}
		sys := int64(r.IntN(o.SystemPrompts))
		for k := 0; k < n; k++ {
			t := Turn{Seed: r.Uint64(), Output: o.MinOutput + r.IntN(o.MaxOutput-o.MinOutput+1)}
			if k == 0 {
				// The system prompt is one "trace block" per token of a
				// shared id, so sessions of one group share it exactly.
				t.Trace = []int64{-1 - sys}
				t.Input = o.SystemTokens
				t.New = o.FirstTokens
			} else {
				t.New = o.MinTool + r.IntN(o.MaxTool-o.MinTool+1)
			}
			sess.Turns = append(sess.Turns, t)
		}
		w.Sessions = append(w.Sessions, sess)
	}
	w.TraceBlock = o.SystemTokens
	return w, nil
}

// SharedPrefixOptions shapes the shared-prefix workload: independent
// requests, each one of Groups long system prompts followed by a distinct
// question.
type SharedPrefixOptions struct {
	Requests, Groups       int
	PrefixTokens, Question int
	Output                 int
	// Rate is requests per second (Poisson) at load 1.
	Rate float64
	Seed uint64
}

// DefaultSharedPrefixOptions: 6,000 requests over 200 prefixes of 4k
// tokens: 12,800 blocks of 64, more than one worker holds and less than an
// 8-worker fleet does, so where a prefix lives matters.
func DefaultSharedPrefixOptions() SharedPrefixOptions {
	return SharedPrefixOptions{Requests: 6000, Groups: 200, PrefixTokens: 4096, Question: 256, Output: 128, Rate: 10, Seed: 2}
}

// SharedPrefixWorkload builds the shared-prefix workload.
func SharedPrefixWorkload(o SharedPrefixOptions) (*Workload, error) {
	if o.Requests < 1 || o.Groups < 1 || o.PrefixTokens < 1 || o.Output < 1 || !(o.Rate > 0) {
		return nil, fmt.Errorf("shared-prefix workload: inconsistent options %+v", o)
	}
	r := rand.New(rand.NewPCG(o.Seed, 0x5ba4ed))
	w := &Workload{Name: "shared_prefix", TraceBlock: o.PrefixTokens, Params: map[string]any{
		"requests": o.Requests, "groups": o.Groups, "prefix_tokens": o.PrefixTokens,
		"question_tokens": o.Question, "output_tokens": o.Output, "requests_per_second": o.Rate,
	}}
	var at time.Duration
	for i := 0; i < o.Requests; i++ {
		at += time.Duration(r.ExpFloat64() / o.Rate * float64(time.Second))
		g := int64(r.IntN(o.Groups))
		w.Sessions = append(w.Sessions, Session{Start: at, Turns: []Turn{{
			Trace: []int64{-1000 - g}, Input: o.PrefixTokens, New: o.Question, Seed: r.Uint64(), Output: o.Output,
		}}})
	}
	return w, nil
}

// NoReuseOptions shapes the zero-reuse workload: every prompt is fresh.
type NoReuseOptions struct {
	Requests             int
	MinPrompt, MaxPrompt int
	MinOutput, MaxOutput int
	Rate                 float64
	Seed                 uint64
}

// DefaultNoReuseOptions: 4,000 requests of 1k–8k fresh tokens.
func DefaultNoReuseOptions() NoReuseOptions {
	return NoReuseOptions{Requests: 4000, MinPrompt: 1024, MaxPrompt: 8192, MinOutput: 50, MaxOutput: 400, Rate: 4, Seed: 3}
}

// NoReuseWorkload builds the zero-reuse workload.
func NoReuseWorkload(o NoReuseOptions) (*Workload, error) {
	if o.Requests < 1 || o.MinPrompt < 1 || o.MaxPrompt < o.MinPrompt || o.MinOutput < 1 || o.MaxOutput < o.MinOutput || !(o.Rate > 0) {
		return nil, fmt.Errorf("no-reuse workload: inconsistent options %+v", o)
	}
	r := rand.New(rand.NewPCG(o.Seed, 0x7e3))
	w := &Workload{Name: "no_reuse", TraceBlock: 1, Params: map[string]any{
		"requests": o.Requests, "prompt_tokens": fmt.Sprintf("%d-%d", o.MinPrompt, o.MaxPrompt),
		"output_tokens": fmt.Sprintf("%d-%d", o.MinOutput, o.MaxOutput), "requests_per_second": o.Rate,
	}}
	var at time.Duration
	for i := 0; i < o.Requests; i++ {
		at += time.Duration(r.ExpFloat64() / o.Rate * float64(time.Second))
		w.Sessions = append(w.Sessions, Session{Start: at, Turns: []Turn{{
			New: o.MinPrompt + r.IntN(o.MaxPrompt-o.MinPrompt+1), Seed: r.Uint64(),
			Output: o.MinOutput + r.IntN(o.MaxOutput-o.MinOutput+1),
		}}})
	}
	return w, nil
}
