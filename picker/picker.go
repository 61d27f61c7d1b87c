package picker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
)

// BadBodyPolicy says what to do with a body that is not JSON.
type BadBodyPolicy int

const (
	// BadBodyReject answers 400 (--on-bad-body=reject, the default).
	BadBodyReject BadBodyPolicy = iota
	// BadBodyRouteByLoad routes the request on load alone.
	BadBodyRouteByLoad
)

// ParseBadBodyPolicy reads the --on-bad-body flag value.
func ParseBadBodyPolicy(s string) (BadBodyPolicy, error) {
	switch s {
	case "reject", "":
		return BadBodyReject, nil
	case "route-by-load":
		return BadBodyRouteByLoad, nil
	}
	return 0, fmt.Errorf("on-bad-body %q: want reject or route-by-load", s)
}

// Metrics receives the decision-path counters. Implementations must
// be safe for concurrent use.
type Metrics interface {
	// Decided counts one decision by outcome: "routed", "no_worker",
	// "no_fleet" (no worker known at all: the data plane's failure mode
	// decides), "shed", "overloaded" (no decision slot, MaxConcurrent),
	// "bad_body", "cancelled" (the request ended mid-decision: work
	// stopped) or "error".
	Decided(model, worker, mode, outcome string)
	// Phase records how long one phase took: "parse", "tokenize", "match"
	// or "pick" (pick includes any wait in the admission queue).
	Phase(phase string, d time.Duration)
	// Overlap records the chosen worker's cached share of the prompt.
	Overlap(ratio float64, cachedTokens int)
	// ByLoad counts a request routed without its prompt, by reason:
	// "no_body", "not_json", "truncated", "other_path", "no_tokenizer",
	// "no_prompt", "template_error", "tokenizer_error", and the caps:
	// "too_many_messages", "prompt_too_large".
	ByLoad(model, reason string)
	// Finished counts a routed request's end by outcome.
	Finished(outcome extproc.Outcome)
}

type nopMetrics struct{}

var _ Metrics = nopMetrics{}

func (nopMetrics) Decided(string, string, string, string) {}
func (nopMetrics) Phase(string, time.Duration)            {}
func (nopMetrics) Overlap(float64, int)                   {}
func (nopMetrics) ByLoad(string, string)                  {}
func (nopMetrics) Finished(extproc.Outcome)               {}

// Config configures a Picker.
type Config struct {
	// Scheduler holds the pool and the mode. Required.
	Scheduler *scoring.Scheduler
	// Index is the KV-event index for modes that want OverlapEvents.
	Index *kvindex.Index
	// Approx is the approximate index for modes that want OverlapApprox.
	Approx *kvindex.Approx
	// Tokenizers maps served model and LoRA adapter names to tokenizers
	// (NewTokenizerRegistry builds it from a typed map); nil routes
	// everything by load.
	Tokenizers *tokenizer.Registry
	// BlockSize, when positive, overrides every worker's block size for
	// hashing (--kv-cache-block-size).
	BlockSize int
	// Fallbacks is how many next-best endpoints follow the primary in
	// x-gateway-destination-endpoint.
	Fallbacks int
	// OnBadBody decides between 400 and routing by load.
	OnBadBody BadBodyPolicy
	// ModelHeader names a request header that carries the model when the
	// body is not available (body mode NONE); empty means none.
	ModelHeader string
	// Multimodal declares the vision-language models by served or base
	// model name: chat requests with image parts for them are placed and
	// hashed with the images' identities (docs/architecture.md §3.5);
	// image requests for other models are routed by load.
	Multimodal map[string]MultimodalModel
	// MaxMessages caps the messages of a chat request that the router
	// renders and tokenizes; a longer chat is routed by load
	// ("too_many_messages"). 0: no cap.
	MaxMessages int
	// MaxPromptBytes caps the rendered chat prompt (or completion prompt
	// text) the router tokenizes; a longer one is routed by load
	// ("prompt_too_large"). 0: no cap.
	MaxPromptBytes int
	// MaxConcurrent caps decisions in their parse, tokenize and match
	// phases at once (the queue wait of the pick is not counted). A
	// decision that finds no slot within DecisionWait is shed with 429
	// (outcome "overloaded"). 0: no cap.
	MaxConcurrent int
	// DecisionWait is how long a decision waits for a slot (default 10 s).
	// Waiting costs no memory beyond the body the stream already holds, so
	// the wait is long: a burst of long prompts on a busy machine queues
	// instead of failing; only a sustained overload is shed.
	DecisionWait time.Duration
	// Explain keeps every decision's explanation (the shape of
	// /debug/explain) in Decision.Explanation, for the request log. It
	// costs one candidate list per decision; the candidates' text lines
	// are rendered only when the explanation is encoded.
	Explain bool
	// Metrics may be nil.
	Metrics Metrics
	// Logger may be nil (slog.Default()). The decision line goes out at
	// debug level; prompts are never logged.
	Logger *slog.Logger
}

// Picker is the real Decider: it parses the OpenAI body, tokenizes the
// prompt as the model server will, hashes its blocks, asks the KV index
// which candidate holds how many, and lets the scoring Scheduler pick (and
// queue, or shed).
type Picker struct {
	cfg     Config
	sched   *scoring.Scheduler
	metrics Metrics
	log     *slog.Logger
	seq     atomic.Uint64
	idBase  string
	slots   chan struct{} // nil: no concurrency cap

	completions completionEncoder
	mmSpecs     mmSpecs
}

var _ extproc.Decider = (*Picker)(nil)

// New returns a Picker.
func New(cfg Config) (*Picker, error) {
	if cfg.Scheduler == nil {
		return nil, errors.New("extproc: Config.Scheduler is required")
	}
	p := &Picker{cfg: cfg, sched: cfg.Scheduler, metrics: cfg.Metrics, log: cfg.Logger}
	if p.metrics == nil {
		p.metrics = nopMetrics{}
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.idBase = strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	if cfg.MaxConcurrent > 0 {
		p.slots = make(chan struct{}, cfg.MaxConcurrent)
	}
	if p.cfg.DecisionWait <= 0 {
		p.cfg.DecisionWait = 10 * time.Second
	}
	return p, nil
}

// Scheduler returns the scoring scheduler the Picker decides with.
func (p *Picker) Scheduler() *scoring.Scheduler { return p.sched }

// Decide implements Decider.
func (p *Picker) Decide(ctx context.Context, req *extproc.Request) (extproc.Decision, error) {
	r := p.sched
	if err := p.acquire(ctx); err != nil {
		p.metrics.Decided("", "", r.Mode().Name(), outcomeOf(err))
		return extproc.Decision{}, err
	}
	pl, err := p.plan(ctx, r, req, p.metrics)
	p.release()
	if err != nil {
		p.metrics.Decided(pl.sreq.Model, "", r.Mode().Name(), outcomeOf(err))
		return extproc.Decision{}, err
	}
	pl.sreq.ID = p.idBase + strconv.FormatUint(p.seq.Add(1), 36)
	var exp *scoring.Explanation
	if p.cfg.Fallbacks > 0 || p.cfg.Explain || p.log.Enabled(ctx, slog.LevelDebug) {
		exp = &scoring.Explanation{}
	}
	start := time.Now()
	d, err := r.Route(ctx, &pl.sreq, pl.cands, exp)
	p.metrics.Phase("pick", time.Since(start))
	if err != nil {
		err = p.routeError(pl.sreq.Model, err)
		p.metrics.Decided(pl.sreq.Model, "", r.Mode().Name(), outcomeOf(err))
		return extproc.Decision{}, err
	}
	cached := d.MatchedBlocks * pl.blockSizeOf(d.Index)
	if pl.sreq.PromptTokens > 0 {
		p.metrics.Overlap(float64(min(cached, pl.sreq.PromptTokens))/float64(pl.sreq.PromptTokens), cached)
	}
	p.metrics.Decided(pl.sreq.Model, d.Worker, r.Mode().Name(), "routed")
	if exp != nil && p.log.Enabled(ctx, slog.LevelDebug) {
		for i := range exp.Workers {
			p.log.Debug("decision term", "request", pl.sreq.ID, "line", exp.Line(i))
		}
		p.log.Debug("decision", "request", pl.sreq.ID, "model", pl.sreq.Model, "worker", d.Worker,
			"prompt_tokens", pl.sreq.PromptTokens, "cached_tokens", cached, "by_load", pl.byLoad)
	}
	fallbacks := pl.fallbacks(exp, d, p.cfg.Fallbacks)
	var explained any
	if p.cfg.Explain {
		explained = &Explanation{
			Model: pl.sreq.Model, API: pl.api, PromptTokens: pl.sreq.PromptTokens, ByLoad: pl.byLoad,
			Chosen: d.Worker, Cluster: d.Cluster, Address: d.Address, Fallbacks: fallbacks,
			CachedTokens:  cached,
			PendingTokens: d.PendingBlocks * pl.blockSizeOf(d.Index),
			Decision:      exp,
		}
	}
	return extproc.Decision{
		Cluster:      d.Cluster,
		Address:      d.Address,
		Fallbacks:    fallbacks,
		Worker:       d.Worker,
		Explanation:  explained,
		Model:        pl.sreq.Model,
		Mode:         r.Mode().Name(),
		CachedTokens: cached,
		Predicted:    pl.matched,
		Ticket:       newTicket(r.Pool(), pl.sreq.ID, d.Worker, p.metrics),
		Body:         pl.body,
	}, nil
}

// acquire takes a decision slot, waiting up to DecisionWait; it fails with
// a 429 when none frees up, or with ctx's error.
func (p *Picker) acquire(ctx context.Context) error {
	if p.slots == nil {
		return nil
	}
	select {
	case p.slots <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(p.cfg.DecisionWait)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return &extproc.HTTPError{Status: 429, Type: "rate_limit_error", Code: codeOverloaded,
			Message: fmt.Sprintf("the router is busy with %d routing decisions; retry shortly", cap(p.slots))}
	}
}

func (p *Picker) release() {
	if p.slots != nil {
		<-p.slots
	}
}

// codeOverloaded is the error code of a decision shed by MaxConcurrent.
const codeOverloaded = "router_overloaded"

// routeError maps scoring's errors to what the client sees.
func (p *Picker) routeError(model string, err error) error {
	var shed *scoring.ShedError
	switch {
	case errors.As(err, &shed):
		e := extproc.ErrShed(fmt.Sprintf("the router's admission queue is full for model %q (%s)", model, shed.Reason))
		e.Err = err
		return e
	case errors.Is(err, scoring.ErrNoWorkers):
		e := extproc.ErrNoWorker(fmt.Sprintf("no worker can serve model %q", model))
		e.Err = err
		return e
	}
	return err
}

func outcomeOf(err error) string {
	var he *extproc.HTTPError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	case errors.Is(err, extproc.ErrNoFleet):
		return "no_fleet"
	case errors.As(err, &he):
		switch he.Status {
		case 503:
			return "no_worker"
		case 429:
			if he.Code == codeOverloaded {
				return "overloaded"
			}
			return "shed"
		case 400:
			return "bad_body"
		}
	}
	return "error"
}
