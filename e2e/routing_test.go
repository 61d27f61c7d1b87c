package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/internal/bench"
)

// A conversation's second turn goes to the worker that served the first,
// and that worker really reuses the prefix (cached_tokens in usage).
func TestSecondTurnLandsOnWorkerHoldingPrefix(t *testing.T) {
	s := start(t, options{})
	type conv struct {
		system, q1, a1, q2 string
		first              bench.Result
	}
	convs := make([]*conv, 4)
	for i := range convs {
		convs[i] = &conv{
			system: longText(fmt.Sprintf("persona %d", i), 30),
			q1:     fmt.Sprintf("Question one of conversation %d: what is a KV cache?", i),
			a1:     "A KV cache keeps attention keys and values so a prefix is not computed twice.",
			q2:     "And why does routing matter for it?",
		}
		convs[i].first = s.send(t, chat(convs[i].system, convs[i].q1))
		if convs[i].first.CachedTokens != 0 {
			t.Fatalf("conversation %d: first turn reports %d cached tokens on a cold fleet", i, convs[i].first.CachedTokens)
		}
	}
	for i, c := range convs {
		eventually(t, "the router to index the first turn's blocks", func() bool {
			blocks, _, _ := s.indexed(c.first.Worker)
			return blocks > 0
		})
		second := s.send(t, chat(c.system, c.q1, c.a1, c.q2))
		if second.Worker != c.first.Worker {
			t.Errorf("conversation %d: second turn went to %s, the prefix is on %s", i, second.Worker, c.first.Worker)
		}
		if min := c.first.PromptTokens / 2; second.CachedTokens < min {
			t.Errorf("conversation %d: second turn reused %d tokens of a %d-token first prompt, want at least %d",
				i, second.CachedTokens, c.first.PromptTokens, min)
		}
	}
}

// A flood of prompts sharing one long system prompt is spread by the load
// term instead of piling onto the worker that holds the prefix, and the
// prefix is still reused. With the default latency cost a cold worker pays
// the 2,048-token prefix plus the duplicate-prefill term (0.75 of it again),
// about 3,600 token-equivalents, and a warm one 128 per active request
// (--decode-active-request-weight 8 blocks of 16 tokens), so the holder
// takes new requests until it carries about 28. The 64 requests are sent at
// once and answer 512 tokens, and the workers' simulated time runs only 5×
// faster than real (512 decode steps take over a second), so the requests
// overlap on the workers even when a busy machine sends them slowly: more
// than one worker must take a real share.
func TestSharedPrefixFloodSpreadsOverFleet(t *testing.T) {
	s := start(t, options{speedup: 5})
	w, err := bench.SharedPrefixWorkload(bench.SharedPrefixOptions{
		Model: model, Groups: 1, PerGroup: 64, SystemTokens: 2048, QuestionTokens: 64, OutputTokens: 512, Seed: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	results, err := bench.Run(ctx, s.client, w, bench.RunOptions{Arrival: bench.Arrival{Kind: bench.ArrivalConcurrency, Concurrency: 64}})
	if err != nil {
		t.Fatal(err)
	}
	m := bench.Measure(results, 0)
	if m.Errors != 0 || m.Requests != 64 {
		t.Fatalf("%d requests, %d errors (first: %s)", m.Requests, m.Errors, m.FirstError)
	}
	used := 0
	for _, id := range s.ids() {
		if m.WorkerShare[id] >= 0.10 {
			used++
		}
	}
	t.Logf("shares of the flood: %v", m.WorkerShare)
	if used < 2 {
		t.Errorf("only %d worker(s) served at least 10%% of the flood, want at least 2 (shares %v)", used, m.WorkerShare)
	}
	// Each worker computes the prefix once; everything after reuses it.
	if m.HitRate < 0.5 {
		t.Errorf("hit rate %.2f, want most of the shared prefix reused", m.HitRate)
	}
}

// /debug/explain predicts the decision the router then takes for the same
// request, including how many tokens the chosen worker will find cached.
func TestExplainAgreesWithDecision(t *testing.T) {
	s := start(t, options{})
	for i, warm := range s.ids() {
		system := longText(fmt.Sprintf("explain %d", i), 25)
		s.direct(t, warm, chat(system, "warm up"))
		body := chat(system, "warm up", "ok", "now the real question")
		var x = s.explain(t, body)
		eventually(t, "the router to learn the warmed prefix", func() bool {
			x = s.explain(t, body)
			return x.CachedTokens > 0
		})
		if x.Chosen != warm {
			t.Errorf("prompt %d: explain picks %s, the prefix is on %s", i, x.Chosen, warm)
		}
		got := s.send(t, body)
		if got.Worker != x.Chosen {
			t.Errorf("prompt %d: explain said %s, the request went to %s", i, x.Chosen, got.Worker)
		}
		if got.CachedTokens != x.CachedTokens {
			t.Errorf("prompt %d: explain predicted %d cached tokens, the worker reported %d", i, x.CachedTokens, got.CachedTokens)
		}
		if x.PromptTokens != got.PromptTokens {
			t.Errorf("prompt %d: explain counted %d prompt tokens, the worker %d", i, x.PromptTokens, got.PromptTokens)
		}
	}
}

// Both request body modes kvroute supports work through Envoy: BUFFERED
// (cluster-header.yaml) and FULL_DUPLEX_STREAMED (original-dst.yaml, the
// Gateway API Inference Extension's mode).
func TestBothBodyModesThroughEnvoy(t *testing.T) {
	for _, tc := range []struct{ name, style string }{
		{"buffered", envoy.StyleClusterHeader},
		{"full_duplex_streamed", envoy.StyleOriginalDst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, options{workers: 3, style: tc.style})
			system := longText(tc.name, 30)
			first := s.send(t, chat(system, "first"))
			eventually(t, "the router to index the first request", func() bool {
				blocks, _, _ := s.indexed(first.Worker)
				return blocks > 0
			})
			second := s.send(t, chat(system, "first", "reply", "second"))
			if second.Worker != first.Worker || second.CachedTokens == 0 {
				t.Errorf("second request on %s with %d cached tokens, want %s with its prefix cached",
					second.Worker, second.CachedTokens, first.Worker)
			}
			if second.OutputTokens != 8 {
				t.Errorf("streamed %d tokens back, want 8", second.OutputTokens)
			}
			// Token-id completions take the same path.
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			w := bench.TraceWorkload([]bench.TraceRecord{{InputLength: 700, OutputLength: 4, HashIDs: []int64{1, 2}}},
				bench.TraceOptions{Model: model})
			r := s.client.Do(ctx, &w.Flows[0].Items[0])
			if r.Err != nil || r.PromptTokens != 700 || r.OutputTokens != 4 {
				t.Errorf("completions: err %v, %d prompt tokens, %d output tokens", r.Err, r.PromptTokens, r.OutputTokens)
			}
		})
	}
}
