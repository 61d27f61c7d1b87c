package picker

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
)

// Explanation is a decision with its reasons, for /debug/explain.
type Explanation struct {
	Model        string `json:"model"`
	API          API    `json:"api"`
	PromptTokens int    `json:"prompt_tokens"`
	// ByLoad says why the prompt was not used ("" when it was).
	ByLoad       string   `json:"routed_by_load,omitempty"`
	Chosen       string   `json:"chosen"`
	Cluster      string   `json:"cluster"`
	Address      string   `json:"address"`
	Fallbacks    []string `json:"fallbacks,omitempty"`
	CachedTokens int      `json:"cached_tokens"`
	// PendingTokens is the part of CachedTokens the chosen worker holds
	// only in the router's pending overlay: blocks sent to it recently
	// that its KV events have not confirmed yet.
	PendingTokens int `json:"pending_tokens,omitempty"`
	// Decision holds every candidate's terms.
	Decision *scoring.Explanation `json:"decision"`
	// Lines are the decision's log lines, one per candidate.
	Lines []string `json:"lines"`
}

// MarshalJSON renders Lines from Decision when they were left for later
// (the request log keeps explanations without rendering them).
func (e *Explanation) MarshalJSON() ([]byte, error) {
	type plain Explanation
	out := plain(*e)
	if out.Lines == nil && out.Decision != nil {
		out.Lines = make([]string, 0, len(out.Decision.Workers))
		for i := range out.Decision.Workers {
			out.Lines = append(out.Lines, out.Decision.Line(i))
		}
	}
	return json.Marshal(out)
}

// Explain decides for req as Decide would, without queueing, without adding
// load, without counting metrics and without moving a stateful mode
// (round_robin's counter: Scheduler.Preview), and returns every
// candidate's terms.
func (p *Picker) Explain(req *extproc.Request) (*Explanation, error) {
	return p.ExplainContext(context.Background(), req)
}

// ExplainContext is Explain that stops when ctx ends.
func (p *Picker) ExplainContext(ctx context.Context, req *extproc.Request) (*Explanation, error) {
	r := p.Scheduler()
	pl, err := p.plan(ctx, r, req, nopMetrics{})
	if err != nil {
		return nil, err
	}
	exp := &scoring.Explanation{}
	d, err := r.Preview(&pl.sreq, pl.cands, exp)
	if err != nil {
		return nil, p.routeError(pl.sreq.Model, err)
	}
	out := &Explanation{
		Model: pl.sreq.Model, API: pl.api, PromptTokens: pl.sreq.PromptTokens, ByLoad: pl.byLoad,
		Chosen: d.Worker, Cluster: d.Cluster, Address: d.Address,
		Fallbacks:     pl.fallbacks(exp, d, p.cfg.Fallbacks),
		CachedTokens:  d.MatchedBlocks * pl.blockSizeOf(d.Index),
		PendingTokens: d.PendingBlocks * pl.blockSizeOf(d.Index),
		Decision:      exp,
	}
	for i := range exp.Workers {
		out.Lines = append(out.Lines, exp.Line(i))
	}
	return out, nil
}
