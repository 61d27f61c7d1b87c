package bench

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Paths of the two OpenAI APIs the workloads use.
const (
	PathCompletions = "/v1/completions"
	PathChat        = "/v1/chat/completions"
)

// Item is one request of a workload, ready to send.
type Item struct {
	// Path is the API path; Body the JSON body (streaming, with usage).
	Path string
	Body []byte
	// Prompt is the prompt's token ids when the workload knows them (the
	// reference hit rates need them); nil otherwise.
	Prompt []int32
	// PromptLen and OutputLen are the prompt's length in tokens (when
	// known) and max_tokens.
	PromptLen, OutputLen int
	// Follows is the earlier request whose prefix this one continues: the
	// previous turn of a session, the previous request of a shared-prefix
	// group, or for a trace the latest earlier record sharing the most
	// (at least two) leading hash ids. Nil for a request that starts
	// something new. Stickiness is measured on these follow-ups.
	Follows *ItemRef
}

// ItemRef names an item of a workload: Flows[Flow].Items[Item].
type ItemRef struct {
	Flow, Item int
}

// Flow is a sequence of items sent one after the other: one request for a
// trace record, the turns of a chat session. Flows run concurrently.
type Flow struct {
	// At is when the flow starts, relative to the start of the run, for
	// trace arrival; other arrival processes ignore it.
	At time.Duration
	// Think is the pause between the end of one item and the next.
	Think time.Duration
	Items []Item
}

// Workload is what a run replays, with the parameters that describe it.
type Workload struct {
	// Name says what it is ("trace", "shared_prefix", "chat").
	Name string
	// Params are reported with the results.
	Params map[string]any
	Flows  []Flow
}

// Requests counts the items of all flows.
func (w *Workload) Requests() int {
	n := 0
	for i := range w.Flows {
		n += len(w.Flows[i].Items)
	}
	return n
}

// Limit keeps the flows whose items fit in max requests (0: all).
func (w *Workload) Limit(max int) {
	if max <= 0 {
		return
	}
	n := 0
	for i := range w.Flows {
		n += len(w.Flows[i].Items)
		if n >= max {
			w.Flows[i].Items = w.Flows[i].Items[:len(w.Flows[i].Items)-(n-max)]
			w.Flows = w.Flows[:i+1]
			return
		}
	}
}

// completionBody renders a streaming /v1/completions body with a token-id
// prompt. ignore_eos makes the output exactly maxTokens long, as the trace
// says it was.
func completionBody(model string, prompt []int32, maxTokens int) []byte {
	b := make([]byte, 0, 32+len(model)+6*len(prompt)+128)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, model)
	b = append(b, `,"prompt":[`...)
	for i, t := range prompt {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(t), 10)
	}
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	b = append(b, `,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`...)
	return b
}

// TraceOptions shapes a trace workload.
type TraceOptions struct {
	// Model goes into every body.
	Model string
	// BlockSize is the trace's tokens per hash id (default 512).
	BlockSize int
	// TimeScale divides the trace's timestamps (2 replays twice as fast).
	TimeScale float64
}

// TraceWorkload turns trace records into single-request flows at the
// trace's (scaled) timestamps, relative to the first record.
func TraceWorkload(recs []TraceRecord, opt TraceOptions) *Workload {
	if opt.BlockSize <= 0 {
		opt.BlockSize = DefaultTraceBlockSize
	}
	if opt.TimeScale <= 0 {
		opt.TimeScale = 1
	}
	w := &Workload{Name: "trace", Params: map[string]any{
		"records": len(recs), "block_size": opt.BlockSize, "time_scale": opt.TimeScale, "model": opt.Model,
	}}
	if len(recs) == 0 {
		return w
	}
	t0 := recs[0].Timestamp
	follows := traceFollowUps(recs)
	for i, r := range recs {
		p := TracePrompt(r, opt.BlockSize)
		at := time.Duration(float64(r.Timestamp-t0) * float64(time.Millisecond) / opt.TimeScale)
		it := Item{
			Path: PathCompletions, Body: completionBody(opt.Model, p, r.OutputLength),
			Prompt: p, PromptLen: len(p), OutputLen: r.OutputLength,
		}
		if follows[i] >= 0 {
			it.Follows = &ItemRef{Flow: follows[i]}
		}
		w.Flows = append(w.Flows, Flow{At: at, Items: []Item{it}})
	}
	w.Params["trace_seconds"] = float64(recs[len(recs)-1].Timestamp-t0) / 1000
	return w
}

// minSharedHashIDs is how many leading hash ids a trace record must share
// with an earlier one to be its follow-up: one is not enough, as many
// unrelated conversations share a root block.
const minSharedHashIDs = 2

// traceFollowUps returns, per record, the index of the latest earlier
// record sharing the longest run of at least minSharedHashIDs leading hash
// ids with it, or -1.
func traceFollowUps(recs []TraceRecord) []int {
	out := make([]int, len(recs))
	// last maps a prefix of hash ids (as a chained hash) to the latest
	// record holding it.
	last := map[uint64]int{}
	keys := make([]uint64, 0, 64)
	for i, r := range recs {
		keys = keys[:0]
		var h uint64 = 14695981039346656037
		for _, id := range r.HashIDs {
			h = (h ^ uint64(id)) * 1099511628211
			h ^= h >> 29
			keys = append(keys, h)
		}
		out[i] = -1
		for n := len(keys); n >= minSharedHashIDs; n-- {
			if j, ok := last[keys[n-1]]; ok {
				out[i] = j
				break
			}
		}
		for n := minSharedHashIDs; n <= len(keys); n++ {
			last[keys[n-1]] = i
		}
	}
	return out
}

// SharedPrefixOptions shapes a shared-prefix workload: Groups system
// prompts, each followed by PerGroup distinct questions.
type SharedPrefixOptions struct {
	Model                        string
	Groups, PerGroup             int
	SystemTokens, QuestionTokens int
	OutputTokens                 int
	// Seed varies the token content between runs.
	Seed int64
}

// SharedPrefixWorkload builds G×P single-request flows, interleaved
// round-robin over the groups so that every group is in flight at once.
func SharedPrefixWorkload(opt SharedPrefixOptions) (*Workload, error) {
	if opt.Groups <= 0 || opt.PerGroup <= 0 || opt.SystemTokens <= 0 || opt.QuestionTokens <= 0 || opt.OutputTokens <= 0 {
		return nil, fmt.Errorf("shared-prefix workload: groups, per-group, system, question and output lengths must be positive: %+v", opt)
	}
	w := &Workload{Name: "shared_prefix", Params: map[string]any{
		"groups": opt.Groups, "per_group": opt.PerGroup, "system_tokens": opt.SystemTokens,
		"question_tokens": opt.QuestionTokens, "output_tokens": opt.OutputTokens, "model": opt.Model,
	}}
	base := opt.Seed << 32
	for p := 0; p < opt.PerGroup; p++ {
		for g := 0; g < opt.Groups; g++ {
			prompt := make([]int32, 0, opt.SystemTokens+opt.QuestionTokens)
			prompt = BlockTokens(prompt, base+int64(g), opt.SystemTokens)
			prompt = BlockTokens(prompt, base+int64(1<<20+g*opt.PerGroup+p), opt.QuestionTokens)
			it := Item{
				Path: PathCompletions, Body: completionBody(opt.Model, prompt, opt.OutputTokens),
				Prompt: prompt, PromptLen: len(prompt), OutputLen: opt.OutputTokens,
			}
			if p > 0 {
				it.Follows = &ItemRef{Flow: len(w.Flows) - opt.Groups}
			}
			w.Flows = append(w.Flows, Flow{Items: []Item{it}})
		}
	}
	return w, nil
}

// chatMessage is one OpenAI chat message.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatBody renders a streaming chat completions body.
func chatBody(model string, msgs []chatMessage, maxTokens int) ([]byte, error) {
	b, err := json.Marshal(map[string]any{
		"model": model, "messages": msgs, "max_tokens": maxTokens, "ignore_eos": true,
		"stream": true, "stream_options": map[string]any{"include_usage": true},
	})
	if err != nil {
		return nil, fmt.Errorf("chat body: %w", err)
	}
	return b, nil
}
