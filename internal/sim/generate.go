package sim

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Result is the outcome of Generate.
type Result struct {
	// Tokens are the generated token ids.
	Tokens []int32
	// PromptTokens and CachedTokens are as in usage: the prompt length and
	// its prefix-cache hit in tokens.
	PromptTokens, CachedTokens int
	// TTFT is the time from submission to the first token; Latency to the
	// last.
	TTFT, Latency time.Duration
}

// Generate runs one request with token-id prompt on the worker without
// HTTP, for in-process benchmarks and demos. It returns when the request
// finishes, or aborts it when ctx ends.
func (w *Worker) Generate(ctx context.Context, prompt []int32, maxTokens int) (Result, error) {
	if len(prompt) == 0 || maxTokens < 1 || len(prompt)+maxTokens > w.cfg.Engine.TotalTokens() {
		return Result{}, fmt.Errorf("generate on %s: %w: %d prompt tokens, max_tokens %d, capacity %d",
			w.cfg.ID, ErrRequest, len(prompt), maxTokens, w.cfg.Engine.TotalTokens())
	}
	start := time.Now()
	id := w.nextID.Add(1)
	st := newStream(maxTokens)
	// Clip: the engine appends outputs to the prompt it is given.
	w.run.submit(command{kind: cmdAdd, id: id, prompt: slices.Clip(prompt), max: maxTokens, st: st})
	for {
		select {
		case <-st.notify:
		case <-ctx.Done():
			w.run.submit(command{kind: cmdAbort, id: id})
			return Result{}, fmt.Errorf("generate on %s: %w", w.cfg.ID, ctx.Err())
		}
		st.mu.Lock()
		done, err := st.finished, st.err
		var res Result
		if done {
			res = Result{
				Tokens: st.tokens, PromptTokens: st.promptTokens, CachedTokens: st.cachedTokens,
				TTFT: st.times[0].Sub(start), Latency: st.times[len(st.times)-1].Sub(start),
			}
		}
		st.mu.Unlock()
		if err != nil {
			return Result{}, fmt.Errorf("generate on %s: %w", w.cfg.ID, err)
		}
		if done {
			return res, nil
		}
	}
}
