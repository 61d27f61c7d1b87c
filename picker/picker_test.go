package picker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
)

const testModel = "Qwen/Qwen3-8B"

const qwenDir = "../tokenizer/testdata/qwen3"

var (
	qwenOnce sync.Once
	qwenReg  *tokenizer.Registry
	qwenErr  error
)

// qwenRegistry maps testModel to the Qwen3 tokenizer the tokenizer package
// tests with; it is built (and loaded) once per test binary.
func qwenRegistry(t testing.TB) *tokenizer.Registry {
	t.Helper()
	qwenOnce.Do(func() {
		if qwenReg, qwenErr = NewTokenizerRegistry(map[string]tokenizer.ModelSource{testModel: {Dir: qwenDir}}, tokenizer.ChatOptions{}); qwenErr == nil {
			qwenErr = Preload(qwenReg)
		}
	})
	if qwenErr != nil {
		t.Fatalf("load qwen3 tokenizer: %v", qwenErr)
	}
	return qwenReg
}

// qwenChat is testModel's tokenizer.
func qwenChat(t testing.TB) *tokenizer.Chat {
	t.Helper()
	c, err := qwenRegistry(t).Get(testModel)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// countingMetrics is a Metrics that remembers what it saw.
type countingMetrics struct {
	mu       sync.Mutex
	outcomes map[string]int
	byLoad   map[string]int
	finished map[extproc.Outcome]int
	phases   map[string]int
}

func newCountingMetrics() *countingMetrics {
	return &countingMetrics{outcomes: map[string]int{}, byLoad: map[string]int{}, finished: map[extproc.Outcome]int{}, phases: map[string]int{}}
}

func (m *countingMetrics) Decided(model, worker, mode, outcome string) {
	m.mu.Lock()
	m.outcomes[outcome]++
	m.mu.Unlock()
}
func (m *countingMetrics) Phase(p string, d time.Duration) { m.mu.Lock(); m.phases[p]++; m.mu.Unlock() }
func (m *countingMetrics) Overlap(float64, int)            {}
func (m *countingMetrics) ByLoad(model, reason string) {
	m.mu.Lock()
	m.byLoad[reason]++
	m.mu.Unlock()
}
func (m *countingMetrics) Finished(o extproc.Outcome) { m.mu.Lock(); m.finished[o]++; m.mu.Unlock() }

type testRig struct {
	picker  *Picker
	sched   *scoring.Scheduler
	index   *kvindex.Index
	metrics *countingMetrics
}

// newRig builds a Picker over three workers of testModel (block size 16)
// and one of "other-model", with a real index, scheduler and tokenizer.
func newRig(t testing.TB, mutate func(*scoring.Options, *Config)) *testRig {
	t.Helper()
	opts := scoring.DefaultOptions()
	cfg := Config{Fallbacks: 2, Tokenizers: qwenRegistry(t)}
	if mutate != nil {
		mutate(&opts, &cfg)
	}
	r, err := scoring.NewScheduler(opts)
	if err != nil {
		t.Fatal(err)
	}
	ix := kvindex.New(kvindex.Config{})
	for i := range 3 {
		spec := fleet.Worker{ID: fmt.Sprintf("w%d", i), Model: testModel, Address: fmt.Sprintf("10.0.0.%d:8000", i+1),
			BlockSize: 16, KVTotalBlocks: 1000, MaxNumBatchedTokens: 8192, LoRAAdapters: []string{"adapter-a"}}
		if err := r.Pool().Upsert(spec); err != nil {
			t.Fatal(err)
		}
		ix.AddWorker(spec.ID, spec.Model, spec.BlockSize)
	}
	if err := r.Pool().Upsert(fleet.Worker{ID: "o0", Model: "other-model", Address: "10.0.1.1:8000", BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	m := newCountingMetrics()
	cfg.Scheduler, cfg.Index, cfg.Metrics = r, ix, m
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testRig{picker: p, sched: r, index: ix, metrics: m}
}

// store tells the index that worker holds the first blocks of tokens.
func (rg *testRig) store(t testing.TB, worker string, tokens []uint32, blocks int) {
	t.Helper()
	hs := make([]vllmwire.EngineHash, blocks)
	for i := range hs {
		hs[i] = vllmwire.HashUint(uint64(1000 + i))
	}
	st := rg.index.Apply(worker, vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{
		BlockHashes: hs, TokenIDs: tokens[:blocks*16], BlockSize: 16,
	}}})
	if st.StoredBlocks != blocks {
		t.Fatalf("index stored %d blocks, want %d (%+v)", st.StoredBlocks, blocks, st)
	}
}

// chatTokens is the prompt of a chat body as the Qwen3 tokenizer encodes it.
func chatTokens(t testing.TB, body string) []uint32 {
	t.Helper()
	creq, err := tokenizer.ParseChatRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := qwenChat(t).EncodeChat(creq)
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}

func chatReq(body string) *extproc.Request {
	return &extproc.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(body), HasBody: true, Headers: map[string]string{}}
}

func longChat(words int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"and?"}],"max_tokens":64}`,
		testModel, strings.Repeat("kv cache aware routing ", words))
}

func TestPickerRoutesToTheWorkerHoldingThePrefix(t *testing.T) {
	rg := newRig(t, nil)
	body := longChat(200)
	tokens := chatTokens(t, body)
	rg.store(t, "w2", tokens, len(tokens)/16)

	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	if d.Cluster != "w2" || d.Address != "10.0.0.3:8000" {
		t.Fatalf("routed to %s (%s), want w2", d.Cluster, d.Address)
	}
	if want := len(tokens) / 16 * 16; d.CachedTokens != want {
		t.Errorf("cached tokens %d, want %d", d.CachedTokens, want)
	}
	if len(d.Fallbacks) != 2 || d.Fallbacks[0] == d.Address {
		t.Errorf("fallbacks %v", d.Fallbacks)
	}
	l, _ := rg.sched.Pool().Load("w2")
	if l.ActiveRequests != 1 || l.ActiveBlocks == 0 {
		t.Errorf("load after routing: %+v", l)
	}
	d.Ticket.PrefillDone()
	d.Ticket.Progress(3)
	d.Ticket.Free(extproc.OutcomeOK)
	if l, _ := rg.sched.Pool().Load("w2"); l.ActiveRequests != 0 || l.PrefillTokens != 0 {
		t.Errorf("load after Free: %+v", l)
	}
	if rg.metrics.outcomes["routed"] != 1 || rg.metrics.finished[extproc.OutcomeOK] != 1 || rg.metrics.phases["tokenize"] != 1 {
		t.Errorf("metrics %+v", rg.metrics)
	}
}

func TestPickerDecisions(t *testing.T) {
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprint(i + 7)
	}
	idPrompt := "[" + strings.Join(ids, ",") + "]"
	tests := []struct {
		name     string
		req      *extproc.Request
		badBody  BadBodyPolicy
		status   int    // 0: routed
		byLoad   string // expected ByLoad reason, "" for none
		prompt   int    // expected prompt tokens (checked via Explain), -1 to skip
		inSubset string
	}{
		{name: "chat is tokenized", req: chatReq(longChat(5)), prompt: -1},
		{name: "model without a tokenizer is routed by load", req: chatReq(`{"model":"other-model","messages":[{"role":"user","content":"hi"}]}`), byLoad: "no_tokenizer", prompt: 0},
		{name: "LoRA adapter uses its base model's tokenizer", req: chatReq(`{"model":"adapter-a","messages":[{"role":"user","content":"hi"}]}`), prompt: -1},
		{name: "unknown model is 503", req: chatReq(`{"model":"nope","messages":[]}`), status: 503},
		{name: "invalid JSON is 400", req: chatReq(`{"model":`), status: 400},
		{name: "invalid JSON routed by load when configured", req: chatReq(`{"model":`), badBody: BadBodyRouteByLoad, byLoad: "not_json", prompt: 0},
		{name: "completion token ids need no tokenizer", req: &extproc.Request{Path: "/v1/completions", HasBody: true, Body: []byte(`{"model":"other-model","prompt":` + idPrompt + `}`)}, prompt: 64},
		{name: "completion list routes by its first element", req: &extproc.Request{Path: "/v1/completions?x=1", HasBody: true, Body: []byte(`{"model":"other-model","prompt":[` + idPrompt + `,[1,2]]}`)}, prompt: 64},
		{name: "completion text is tokenized with special tokens", req: &extproc.Request{Path: "/v1/completions", HasBody: true, Body: []byte(`{"model":"` + testModel + `","prompt":"hello world"}`)}, prompt: -1},
		{name: "other paths route by load", req: &extproc.Request{Path: "/v1/embeddings", HasBody: true, Body: []byte(`{"model":"` + testModel + `","input":"x"}`)}, byLoad: "other_path", prompt: 0},
		{name: "no body routes by load over every worker", req: &extproc.Request{Path: "/v1/models", Method: "GET"}, byLoad: "no_body", prompt: 0},
		{name: "subset hint restricts", req: &extproc.Request{Path: "/v1/chat/completions", HasBody: true, Body: []byte(longChat(3)), HasSubset: true, Subset: []string{"10.0.0.2:8000"}}, inSubset: "10.0.0.2:8000", prompt: -1},
		{name: "subset hint with no eligible worker is 503", req: &extproc.Request{Path: "/v1/chat/completions", HasBody: true, Body: []byte(longChat(3)), HasSubset: true, Subset: []string{"10.9.9.9:1"}}, status: 503},
		{name: "truncated body routes by load", req: &extproc.Request{Path: "/v1/chat/completions", HasBody: true, Truncated: true, Body: []byte(`{"model":"`)}, byLoad: "truncated", prompt: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, func(_ *scoring.Options, c *Config) { c.OnBadBody = tt.badBody })
			if tt.req.Headers == nil {
				tt.req.Headers = map[string]string{}
			}
			if tt.prompt >= 0 && tt.status == 0 {
				exp, err := rg.picker.Explain(tt.req)
				if err != nil {
					t.Fatalf("Explain: %v", err)
				}
				if exp.PromptTokens != tt.prompt {
					t.Errorf("prompt tokens %d, want %d", exp.PromptTokens, tt.prompt)
				}
			}
			d, err := rg.picker.Decide(context.Background(), tt.req)
			if tt.status != 0 {
				var he *extproc.HTTPError
				if !errors.As(err, &he) || he.Status != tt.status {
					t.Fatalf("err = %v, want HTTP %d", err, tt.status)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Address == "" || d.Ticket == nil {
				t.Fatalf("decision %+v", d)
			}
			if tt.inSubset != "" && (d.Address != tt.inSubset || len(d.Fallbacks) != 0) {
				t.Errorf("decision %s %v outside subset %s", d.Address, d.Fallbacks, tt.inSubset)
			}
			if tt.byLoad != "" && rg.metrics.byLoad[tt.byLoad] != 1 {
				t.Errorf("by-load reasons %v, want %s", rg.metrics.byLoad, tt.byLoad)
			}
			if tt.byLoad == "" && len(rg.metrics.byLoad) != 0 {
				t.Errorf("unexpected by-load reasons %v", rg.metrics.byLoad)
			}
			// The cached tokens are a prediction exactly when the prompt
			// was matched against the index.
			if d.Predicted != (tt.byLoad == "") {
				t.Errorf("predicted %v, want %v", d.Predicted, tt.byLoad == "")
			}
		})
	}
}

func TestPickerPredictsOnlyInModesThatMatchThePrompt(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want bool
	}{{"kv", true}, {"round_robin", false}} {
		t.Run(tc.mode, func(t *testing.T) {
			rg := newRig(t, func(o *scoring.Options, _ *Config) { o.Mode = tc.mode })
			d, err := rg.picker.Decide(context.Background(), chatReq(longChat(5)))
			if err != nil {
				t.Fatal(err)
			}
			if d.Predicted != tc.want {
				t.Errorf("predicted %v, want %v", d.Predicted, tc.want)
			}
			d.Ticket.Free(extproc.OutcomeOK)
		})
	}
}

func TestPickerShedsWhenTheQueueIsFull(t *testing.T) {
	rg := newRig(t, func(o *scoring.Options, _ *Config) {
		o.QueueThreshold = 0.001
		o.QueueMaxWait = 5 * time.Millisecond
	})
	body := longChat(400)
	first, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	// Saturate the other two workers as well, with prompts of their own
	// (copies of the first would be kept with it: it is computing them).
	for i := range 2 {
		other := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":64}`,
			testModel, strings.Repeat(fmt.Sprintf("unrelated topic %d ", i), 300))
		if _, err := rg.picker.Decide(context.Background(), chatReq(other)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = rg.picker.Decide(context.Background(), chatReq(body))
	var he *extproc.HTTPError
	if !errors.As(err, &he) || he.Status != 429 {
		t.Fatalf("err = %v, want 429", err)
	}
	if rg.metrics.outcomes["shed"] != 1 {
		t.Errorf("outcomes %v", rg.metrics.outcomes)
	}
	first.Ticket.Free(extproc.OutcomeReset)
}

func TestPickerExplainHasNoSideEffects(t *testing.T) {
	rg := newRig(t, nil)
	exp, err := rg.picker.Explain(chatReq(longChat(50)))
	if err != nil {
		t.Fatal(err)
	}
	if len(exp.Decision.Workers) != 3 || len(exp.Lines) != 3 || !strings.Contains(exp.Lines[0], "logit=") {
		t.Errorf("explanation %+v", exp)
	}
	for _, l := range rg.sched.Pool().Snapshot() {
		if l.ActiveRequests != 0 {
			t.Errorf("Explain added load to %s", l.ID)
		}
	}
	if len(rg.metrics.outcomes) != 0 || len(rg.metrics.phases) != 0 {
		t.Errorf("Explain counted metrics: %v %v", rg.metrics.outcomes, rg.metrics.phases)
	}
}

func TestPickerServedReportMovesLoad(t *testing.T) {
	rg := newRig(t, nil)
	d, err := rg.picker.Decide(context.Background(), chatReq(longChat(20)))
	if err != nil {
		t.Fatal(err)
	}
	other := d.Fallbacks[0]
	d.Ticket.Served(other)
	for _, l := range rg.sched.Pool().Snapshot() {
		want := 0
		if l.Address == other {
			want = 1
		}
		if l.ActiveRequests != want {
			t.Errorf("%s (%s) has %d active, want %d", l.ID, l.Address, l.ActiveRequests, want)
		}
	}
	d.Ticket.Free(extproc.OutcomeOK)
}

func TestPickerCancelledInQueueHoldsNoLoad(t *testing.T) {
	rg := newRig(t, func(o *scoring.Options, _ *Config) { o.QueueThreshold = 0.001; o.QueueMaxWait = time.Minute })
	body := longChat(400)
	// Three prompts with nothing in common saturate the three workers (one
	// prompt three times would follow its first copy, pending there).
	for i := range 3 {
		other := strings.Replace(body, "kv cache", fmt.Sprintf("kv%d cache", i), 1)
		if _, err := rg.picker.Decide(context.Background(), chatReq(other)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := rg.picker.Decide(ctx, chatReq(body))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's error", err)
	}
	total := 0
	for _, l := range rg.sched.Pool().Snapshot() {
		total += l.ActiveRequests
	}
	if total != 3 {
		t.Errorf("%d active requests, want the 3 admitted", total)
	}
}

func TestEncodeCompletionMatchesTheTokenizer(t *testing.T) {
	llama, err := tokenizer.LoadChat("../tokenizer/testdata/mistral-sp", "", tokenizer.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*tokenizer.Chat{qwenChat(t), llama} {
		checkEncodeCompletion(t, c)
	}
	if len(llama.Tokenizer().Encode("", true)) == 0 {
		t.Error("mistral-sp should add a BOS token; the prefix path is not exercised")
	}
}

func checkEncodeCompletion(t *testing.T, c *tokenizer.Chat) {
	var enc completionEncoder
	for _, text := range []string{"", "hello", strings.Repeat("a long shared document. ", 500) + "tail 1", strings.Repeat("a long shared document. ", 500) + "tail 2"} {
		// A non-empty dst checks that the ids are appended, not written over.
		got := enc.appendEncode([]uint32{7}, c, text)
		want := append([]uint32{7}, c.Tokenizer().Encode(text, true)...)
		if !slices.Equal(got, want) {
			t.Fatalf("EncodeCompletion(%.20q) differs from Encode(text, true)", text)
		}
	}
}

// Fallbacks follow the cost: the worker holding half the prefix comes
// before the one holding none, whatever their order in the pool.
func TestFallbacksAreOrderedByCost(t *testing.T) {
	rg := newRig(t, nil)
	body := longChat(200)
	tokens := chatTokens(t, body)
	rg.store(t, "w2", tokens, len(tokens)/16)
	rg.store(t, "w1", tokens, len(tokens)/32)
	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.2:8000", "10.0.0.1:8000"}
	if d.Address != "10.0.0.3:8000" || !slices.Equal(d.Fallbacks, want) {
		t.Fatalf("routed to %s with fallbacks %v, want 10.0.0.3:8000 then %v", d.Address, d.Fallbacks, want)
	}
}

// The router counts what it has just sent where: a prompt routed a moment
// ago is pending on its worker, apart from indexed blocks, until the
// worker's events report it stored.
func TestPickerCountsAPromptItJustSentAsPending(t *testing.T) {
	rg := newRig(t, nil)
	rg.index.SetObserver(rg.sched.Pool())
	body := longChat(200)
	tokens := chatTokens(t, body)
	full := len(tokens) / 16
	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Ticket.Free(extproc.OutcomeOK)
	d.Ticket.PrefillDone() // its backlog is done; its blocks stay pending until the events say so

	explain := func() (*Explanation, scoring.Terms) {
		t.Helper()
		x, err := rg.picker.Explain(chatReq(body))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range x.Decision.Workers {
			if w.Worker == d.Cluster {
				return x, w
			}
		}
		t.Fatalf("%s not explained", d.Cluster)
		return nil, scoring.Terms{}
	}
	x, terms := explain()
	if x.Chosen != d.Cluster || x.CachedTokens != full*16 || x.PendingTokens != full*16 || terms.MatchedBlocks != 0 || terms.PendingBlocks != full {
		t.Fatalf("right after routing to %s: chosen %s, cached %d, pending %d tokens, terms matched %d pending %d; want all %d blocks pending",
			d.Cluster, x.Chosen, x.CachedTokens, x.PendingTokens, terms.MatchedBlocks, terms.PendingBlocks, full)
	}
	rg.store(t, d.Cluster, tokens, full)
	x, terms = explain()
	if x.Chosen != d.Cluster || x.CachedTokens != full*16 || x.PendingTokens != 0 || terms.MatchedBlocks != full || terms.PendingBlocks != 0 {
		t.Fatalf("after the events: chosen %s, cached %d, pending %d tokens, terms matched %d pending %d; want all %d blocks indexed",
			x.Chosen, x.CachedTokens, x.PendingTokens, terms.MatchedBlocks, terms.PendingBlocks, full)
	}
	if n := rg.sched.Pool().PendingBlocks(d.Cluster); n != 0 {
		t.Fatalf("%d blocks still pending once the events reported them", n)
	}
}

// TestPickerExplainLeavesRoundRobinWhereItWas: round_robin keeps a
// counter; explaining a request answers the worker the next real request
// gets, any number of times, and does not move it.
func TestPickerExplainLeavesRoundRobinWhereItWas(t *testing.T) {
	rg := newRig(t, func(o *scoring.Options, _ *Config) { o.Mode = scoring.ModeRoundRobin })
	body := longChat(5)
	var explained []string
	for range 4 {
		exp, err := rg.picker.Explain(chatReq(body))
		if err != nil {
			t.Fatal(err)
		}
		explained = append(explained, exp.Address)
	}
	for i := 1; i < len(explained); i++ {
		if explained[i] != explained[0] {
			t.Fatalf("four explanations answered %v, want the same worker each time", explained)
		}
	}
	d, err := rg.picker.Decide(context.Background(), chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free(extproc.OutcomeOK)
	if d.Address != explained[0] {
		t.Errorf("explain said %s, the next request went to %s", explained[0], d.Address)
	}
	exp, err := rg.picker.Explain(chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	if exp.Address == d.Address {
		t.Errorf("after a real request explain still answers %s; the counter should have moved on", exp.Address)
	}
}

// With Explain set, a decision carries the explanation /debug/explain
// would give, its text lines rendered only when it is encoded.
func TestDecideKeepsTheExplanationWhenAsked(t *testing.T) {
	for _, explain := range []bool{false, true} {
		rg := newRig(t, func(_ *scoring.Options, c *Config) { c.Explain = explain })
		d, err := rg.picker.Decide(context.Background(), chatReq(longChat(40)))
		if err != nil {
			t.Fatal(err)
		}
		d.Ticket.Free(extproc.OutcomeOK)
		if d.Worker == "" {
			t.Errorf("explain=%v: the decision names no worker id", explain)
		}
		if !explain {
			if d.Explanation != nil {
				t.Errorf("an explanation kept without Explain: %T", d.Explanation)
			}
			continue
		}
		exp, ok := d.Explanation.(*Explanation)
		if !ok || exp.Chosen != d.Worker || exp.Lines != nil {
			t.Fatalf("explanation %+v (%T), want one choosing %s with lines left for later", d.Explanation, d.Explanation, d.Worker)
		}
		b, err := json.Marshal(exp)
		if err != nil {
			t.Fatal(err)
		}
		var back struct {
			Chosen string   `json:"chosen"`
			Lines  []string `json:"lines"`
		}
		if err := json.Unmarshal(b, &back); err != nil || back.Chosen != d.Worker || len(back.Lines) != 3 {
			t.Errorf("encoded %s (%v), want %s chosen among 3 lines", b, err, d.Worker)
		}
	}
}
