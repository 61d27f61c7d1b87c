package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/vsim"
)

// workloadFlags are the workload and arrival settings demo and replay share.
type workloadFlags struct {
	kind       string
	trace      string
	traceBlock int
	speedup    float64
	load       float64
	// blockSize is the workers' KV block size, set by the command before
	// build: the agent workload's prompts depend on it.
	blockSize      int
	model          string
	arrival        string
	rate           float64
	concurrency    int
	maxRequests    int
	duration       time.Duration
	groups         int
	perGroup       int
	systemTokens   int
	questionTokens int
	outputTokens   int
	sessions       int
	turns          int
	systemPrompts  int
	systemWords    int
	userWords      int
	replyWords     int
	think          time.Duration
	tokenizer      string
	chatTemplate   string
	mmFamily       string
	images         int
	imagePool      int
	seed           uint64

	// bundledMax is how many requests of the bundled trace are replayed
	// unless --max-requests is given (0: all); maxSet records that it was.
	bundledMax int
	maxSet     bool
	// agentLoad, when positive, is --load's default for the agent
	// workload; loadSet records that --load was given.
	agentLoad float64
	loadSet   bool
	// notes are one-line remarks on what build chose, for the user.
	notes []string
}

// register defines the flags; bundledMax is the default slice of the
// bundled trace (an explicit --trace is always replayed whole by default).
func (w *workloadFlags) register(fs *flag.FlagSet, bundledMax int, defSpeedup float64) {
	w.bundledMax = bundledMax
	fs.StringVar(&w.kind, "workload", "trace", "trace (Mooncake JSONL), agent (kvbench sim's multi-turn agent sessions, token ids), shared-prefix or chat")
	fs.StringVar(&w.trace, "trace", "", "Mooncake-format trace (JSONL: timestamp, input_length, output_length, hash_ids); empty: the bundled slice of the Mooncake conversation trace")
	fs.IntVar(&w.traceBlock, "trace-block-size", bench.DefaultTraceBlockSize, "tokens per hash id in the trace")
	fs.Float64Var(&w.speedup, "speedup", defSpeedup, "replay the trace this many times faster (the simulated workers run this much faster too, so the load is the trace's)")
	fs.Float64Var(&w.load, "load", 1, "multiply the arrival rate by this without changing worker speed: trace gaps are divided by it, the Poisson --rate multiplied (not for --arrival concurrency)")
	fs.StringVar(&w.model, "model", bench.DefaultModel, "model name sent in every request")
	fs.StringVar(&w.arrival, "arrival", "", "trace (timestamps ÷ (speedup × load)), poisson (--rate) or concurrency (--concurrency); default: trace for traces, concurrency otherwise")
	fs.Float64Var(&w.rate, "rate", 10, "Poisson arrival rate, flows per second")
	fs.IntVar(&w.concurrency, "concurrency", 16, "flows in flight for --arrival concurrency")
	maxHelp := "send at most this many requests (0: all); when not given, an explicit --trace is replayed whole"
	if bundledMax > 0 {
		maxHelp += fmt.Sprintf(" and the bundled trace's first %d requests are used", bundledMax)
	}
	fs.IntVar(&w.maxRequests, "max-requests", 0, maxHelp)
	fs.DurationVar(&w.duration, "duration", 0, "stop starting new flows after this long (0: no limit)")
	fs.IntVar(&w.groups, "groups", 8, "shared-prefix: number of system prompts")
	fs.IntVar(&w.perGroup, "per-group", 32, "shared-prefix: prompts per group")
	fs.IntVar(&w.systemTokens, "system-tokens", 4096, "shared-prefix: system prompt length in tokens")
	fs.IntVar(&w.questionTokens, "question-tokens", 256, "shared-prefix: question length in tokens")
	fs.IntVar(&w.outputTokens, "output-tokens", 128, "shared-prefix and chat: max_tokens of every request")
	fs.IntVar(&w.sessions, "sessions", 32, "chat: number of conversations")
	fs.IntVar(&w.turns, "turns", 4, "chat: turns per conversation")
	fs.IntVar(&w.systemPrompts, "system-prompts", 4, "chat: distinct system prompts shared by the sessions")
	fs.IntVar(&w.systemWords, "system-words", 600, "chat: words per system prompt")
	fs.IntVar(&w.userWords, "user-words", 80, "chat: words per user message")
	fs.IntVar(&w.replyWords, "reply-words", 120, "chat: words per assistant message in the history")
	fs.DurationVar(&w.think, "think", 200*time.Millisecond, "chat: pause between an answer and the next turn")
	fs.StringVar(&w.tokenizer, "tokenizer", "", "folder with tokenizer.json and tokenizer_config.json: needed for chat (router, workers and reference hit rates)")
	fs.StringVar(&w.chatTemplate, "chat-template", "", "chat template `FILE` replacing the tokenizer's, for workers and router (e.g. multimodal/testdata/qwen2.5-vl.jinja for images)")
	fs.StringVar(&w.mmFamily, "mm-family", "", "serve the model as a vision-language model of this family (qwen2.5-vl, qwen2-vl, qwen3-vl, gemma3): kvsim --mm-family and kvroute --mm-model; needed by chat --images")
	fs.IntVar(&w.images, "images", 0, "chat: images in each conversation's first user message, re-sent every turn (a multimodal chat; needs --mm-family and a template that loops over content)")
	fs.IntVar(&w.imagePool, "image-pool", 16, "chat --images: distinct images the conversations draw from (shared between users)")
	fs.Uint64Var(&w.seed, "seed", 1, "seed of synthetic text, tokens and Poisson gaps")
}

// parsed notes which flags the command line (or environment) set; call it
// after parsing fs.
func (w *workloadFlags) parsed(fs *flag.FlagSet) {
	kindSet := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "max-requests":
			w.maxSet = true
		case "workload":
			kindSet = true
		case "load":
			w.loadSet = true
		}
	})
	// A trace file names the workload by itself.
	if w.trace != "" && !kindSet {
		w.kind = "trace"
	}
}

// note records a remark for the user.
func (w *workloadFlags) note(format string, args ...any) {
	w.notes = append(w.notes, fmt.Sprintf(format, args...))
}

// build loads or synthesizes the workload and its arrival process.
func (w *workloadFlags) build() (*bench.Workload, bench.Arrival, error) {
	var wl *bench.Workload
	var err error
	if w.speedup <= 0 {
		return nil, bench.Arrival{}, fmt.Errorf("--speedup %v must be positive", w.speedup)
	}
	if w.load <= 0 {
		return nil, bench.Arrival{}, fmt.Errorf("--load %v must be positive", w.load)
	}
	if w.maxRequests < 0 {
		return nil, bench.Arrival{}, fmt.Errorf("--max-requests %d must not be negative", w.maxRequests)
	}
	arr := bench.Arrival{Kind: w.arrival, Rate: w.rate * w.load, Concurrency: w.concurrency, Seed: w.seed}
	switch w.kind {
	case "trace":
		var recs []bench.TraceRecord
		name := w.trace
		if w.trace == "" {
			recs, err = bench.BundledTrace()
			name = bench.BundledTraceName
		} else {
			recs, err = bench.ReadTraceFile(w.trace, w.traceBlock)
		}
		if err != nil {
			return nil, arr, err
		}
		limit := w.maxRequests
		switch {
		case !w.maxSet && w.trace == "" && w.bundledMax > 0:
			limit = w.bundledMax
			if limit < len(recs) {
				w.note("note: replaying the first %d of the %d requests of the bundled trace (--max-requests 0 for all of it, --trace FILE for another)", limit, len(recs))
			}
		case limit > 0 && limit < len(recs):
			w.note("note: --max-requests %d: replaying the first %d of the %d requests of %s", limit, limit, len(recs), name)
		}
		if limit > 0 && len(recs) > limit {
			recs = recs[:limit]
		}
		wl = bench.TraceWorkload(recs, bench.TraceOptions{Model: w.model, BlockSize: w.traceBlock, TimeScale: w.speedup * w.load})
		wl.Params["trace"] = name
		if arr.Kind == "" {
			arr.Kind = bench.ArrivalTrace
		}
	case "agent":
		if !w.loadSet && w.agentLoad > 0 {
			w.load = w.agentLoad
		}
		o := vsim.DefaultAgentOptions()
		o.Seed = w.seed
		var aw *vsim.Workload
		if aw, err = vsim.AgentWorkload(o); err != nil {
			return nil, arr, err
		}
		limit := w.maxRequests
		if !w.maxSet && w.bundledMax > 0 {
			limit = w.bundledMax
		}
		// The prompts carry the tokens kvsim generates, which depend on the
		// workers' block size.
		wl = aw.BenchWorkload(sim.EngineConfig{BlockSize: w.blockSize}, w.model, w.speedup*w.load, limit)
		if n := aw.Requests(); limit > 0 && limit < n {
			w.note("note: sending the first %d sessions (%d requests) of the agent workload's %d requests", len(wl.Flows), wl.Requests(), n)
		}
		if arr.Kind == "" {
			arr.Kind = bench.ArrivalTrace
		}
	case "shared-prefix":
		wl, err = bench.SharedPrefixWorkload(bench.SharedPrefixOptions{
			Model: w.model, Groups: w.groups, PerGroup: w.perGroup, SystemTokens: w.systemTokens,
			QuestionTokens: w.questionTokens, OutputTokens: w.outputTokens, Seed: int64(w.seed),
		})
	case "chat":
		if w.tokenizer == "" {
			return nil, arr, fmt.Errorf("the chat workload needs --tokenizer (router and workers must tokenize the same way)")
		}
		if w.images > 0 && w.mmFamily == "" {
			return nil, arr, fmt.Errorf("chat --images needs --mm-family (and a chat template that loops over content)")
		}
		enc, lerr := sim.LoadChatEncoder(w.tokenizer, w.chatTemplate)
		if lerr != nil {
			return nil, arr, lerr
		}
		wl, err = bench.ChatWorkload(bench.ChatOptions{
			Model: w.model, Sessions: w.sessions, Turns: w.turns, SystemPrompts: w.systemPrompts,
			SystemWords: w.systemWords, UserWords: w.userWords, ReplyWords: w.replyWords,
			OutputTokens: w.outputTokens, Think: w.think, Seed: w.seed, Encode: enc.EncodeChat,
			Images: w.images, ImagePool: w.imagePool,
		})
	default:
		return nil, arr, fmt.Errorf("workload %q: want trace, agent, shared-prefix or chat", w.kind)
	}
	if err != nil {
		return nil, arr, err
	}
	if arr.Kind == "" {
		arr.Kind = bench.ArrivalConcurrency
	}
	if arr.Kind == bench.ArrivalTrace && w.kind != "trace" && w.kind != "agent" {
		return nil, arr, fmt.Errorf("--arrival trace needs --workload trace or agent")
	}
	if arr.Kind == bench.ArrivalConcurrency && w.load != 1 {
		return nil, arr, fmt.Errorf("--load needs --arrival trace or poisson: a fixed concurrency has no rate to scale")
	}
	if w.kind != "trace" && w.kind != "agent" {
		if n := wl.Requests(); w.maxRequests > 0 && w.maxRequests < n {
			w.note("note: --max-requests %d: sending the first %d of the workload's %d requests", w.maxRequests, w.maxRequests, n)
		}
		wl.Limit(w.maxRequests)
	}
	wl.Params["arrival"] = arr.Kind
	wl.Params["load"] = w.load
	wl.Params["speedup"] = w.speedup
	switch arr.Kind {
	case bench.ArrivalPoisson:
		wl.Params["rate"] = arr.Rate
	case bench.ArrivalConcurrency:
		wl.Params["concurrency"] = arr.Concurrency
	}
	if w.duration > 0 {
		wl.Params["duration_s"] = w.duration.Seconds()
	}
	return wl, arr, arr.Validate()
}
