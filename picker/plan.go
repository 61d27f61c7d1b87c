package picker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/multimodal"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
)

// plan is everything a decision needs before the pick: the scoring request
// and the candidates with their overlap.
type plan struct {
	sreq      scoring.Request
	api       API
	cands     []scoring.Candidate
	addrs     []string // aligned with cands
	bases     []string // base model per candidate, aligned with cands
	blockSize []int    // aligned with cands
	byLoad    string   // why the prompt was not used; "" when it was
	matched   bool     // the prompt was matched against a KV index
	// mm places the request's images in the prompt (multimodal models).
	mm []kvindex.MMPlacement
	// body, when not nil, replaces the request body upstream (image uuids).
	body []byte
}

func (pl *plan) blockSizeOf(i int) int {
	if i < 0 || i >= len(pl.blockSize) {
		return 0
	}
	return pl.blockSize[i]
}

// fallbacks lists up to n next-best endpoints after the chosen one, for a
// data plane to retry on (the Gateway API endpoint list). With an
// explanation they are the workers the mode weighed, by logit: the mode
// weighs only the best health tier, so an ejected or silent worker never
// follows a healthy primary. Without one, candidate order. A worker at the
// chosen worker's address is no fallback.
func (pl *plan) fallbacks(exp *scoring.Explanation, d scoring.Decision, n int) []string {
	if n <= 0 || len(pl.cands) < 2 {
		return nil
	}
	if exp != nil && len(exp.Workers) > 0 {
		// The n lowest logits, ties in explanation order: a partial
		// selection, since n is tiny and a full sort of a large fleet would
		// cost more than the pick.
		type ranked struct {
			cand  int
			logit float64
		}
		var buf [4]ranked
		best := buf[:0]
		if n > len(buf) {
			best = make([]ranked, 0, n)
		}
		ci := 0 // the explanation lists candidates in candidate order
		for i := range exp.Workers {
			w := &exp.Workers[i]
			for ci < len(pl.cands) && pl.cands[ci].Worker != w.Worker {
				ci++
			}
			c := ci
			if c == len(pl.cands) {
				c, ci = pl.candIndex(w.Worker), 0
			}
			if c < 0 || w.Worker == d.Worker || pl.addrs[c] == d.Address {
				continue
			}
			if len(best) == n && w.Logit >= best[n-1].logit {
				continue
			}
			if len(best) < n {
				best = append(best, ranked{})
			}
			j := len(best) - 1 // the free (or dropped) last slot
			for ; j > 0 && best[j-1].logit > w.Logit; j-- {
				best[j] = best[j-1]
			}
			best[j] = ranked{cand: c, logit: w.Logit}
		}
		out := make([]string, len(best))
		for i, r := range best {
			out[i] = pl.addrs[r.cand]
		}
		return out
	}
	out := make([]string, 0, n)
	for i := range pl.cands {
		if len(out) == n {
			break
		}
		if i != d.Index && pl.addrs[i] != d.Address {
			out = append(out, pl.addrs[i])
		}
	}
	return out
}

// candIndex finds a worker among the candidates, or -1.
func (pl *plan) candIndex(worker string) int {
	for i := range pl.cands {
		if pl.cands[i].Worker == worker {
			return i
		}
	}
	return -1
}

// plan parses, tokenizes, finds the candidates and their overlap. The
// error is an *HTTPError for the client.
//
// ctx is checked between phases, and between messages while tokenizing;
// once it ends, plan stops and returns its error.
func (p *Picker) plan(ctx context.Context, r *scoring.Scheduler, req *extproc.Request, metrics Metrics) (*plan, error) {
	pl := &plan{api: apiOf(req.Path)}
	start := time.Now()
	var oa tokenizer.Request
	switch {
	case !req.HasBody:
		pl.byLoad = "no_body"
		if p.cfg.ModelHeader != "" {
			pl.sreq.Model = req.Header(p.cfg.ModelHeader)
		}
	case req.Truncated:
		pl.byLoad = "truncated"
	default:
		var err error
		oa, err = parseBody(req.Body)
		if err != nil {
			if p.cfg.OnBadBody == BadBodyReject && pl.api != APIOther {
				return pl, extproc.ErrBadBody("request body is not a valid JSON object", err)
			}
			pl.byLoad = "not_json"
		}
		pl.sreq.Model = oa.Model
		pl.sreq.ExpectedOutputTokens = oa.MaxTokens
		if oa.HasPriority {
			pl.sreq.Priority = scoring.ClampPriority(oa.Priority)
		}
	}
	if !oa.HasPriority {
		if h := req.Header("x-kvroute-priority"); h != "" {
			if pr, err := scoring.ParsePriority(h); err == nil {
				pl.sreq.Priority = pr
			}
		}
	}
	metrics.Phase("parse", time.Since(start))
	if err := ctx.Err(); err != nil {
		return pl, err
	}

	if err := p.candidates(r, req, pl); err != nil {
		return pl, err
	}

	start = time.Now()
	buf := getTokenBuffer()
	defer putTokenBuffer(buf)
	tokens, err := p.tokenize(ctx, pl, &oa, buf, req.Body)
	metrics.Phase("tokenize", time.Since(start))
	if err != nil {
		return pl, err
	}
	if pl.byLoad != "" {
		metrics.ByLoad(pl.sreq.Model, pl.byLoad)
	}
	pl.sreq.PromptTokens = len(tokens)

	start = time.Now()
	err = p.overlap(ctx, r, pl, oa.CacheSalt, tokens)
	metrics.Phase("match", time.Since(start))
	return pl, err
}

// candidates lists the workers that serve the model and pass the subset
// hint, with their addresses, base models and block sizes (one Spec read
// per kept candidate; the overlap pass reuses them).
func (p *Picker) candidates(r *scoring.Scheduler, req *extproc.Request, pl *plan) error {
	pool := r.Pool()
	var keep func(id, address string) bool
	if req.HasSubset {
		keep = func(_, address string) bool { return slices.Contains(req.Subset, address) }
	}
	appendFor := func(dst []scoring.Candidate, model string) []scoring.Candidate {
		if keep != nil {
			return pool.AppendCandidatesFunc(dst, model, keep)
		}
		return pool.AppendCandidates(dst, model)
	}
	if pl.sreq.Model != "" {
		pl.cands = appendFor(pl.cands, pl.sreq.Model)
	} else {
		seen := map[string]bool{}
		var all []scoring.Candidate
		for _, m := range pool.Models() {
			all = appendFor(all[:0], m)
			for _, c := range all {
				if !seen[c.Worker] {
					seen[c.Worker] = true
					pl.cands = append(pl.cands, c)
				}
			}
		}
	}
	kept := pl.cands[:0]
	for _, c := range pl.cands {
		spec, ok := pool.Spec(c.Worker)
		if !ok { // removed since the candidate list was built
			continue
		}
		bs := spec.BlockSize
		if p.cfg.BlockSize > 0 {
			bs = p.cfg.BlockSize
		}
		kept = append(kept, c)
		pl.addrs = append(pl.addrs, spec.Address)
		pl.bases = append(pl.bases, spec.Model)
		pl.blockSize = append(pl.blockSize, bs)
	}
	pl.cands = kept
	if len(pl.cands) == 0 {
		switch {
		case pool.Len() == 0:
			// No worker known at all (discovery has not answered, nothing
			// restored): the data plane's failure mode decides, as when
			// the router is down, not a 503 of the router's making.
			return extproc.ErrNoFleet
		case req.HasSubset:
			return extproc.ErrNoWorker(fmt.Sprintf("no worker serving model %q is in the data plane's endpoint subset", pl.sreq.Model))
		case pl.sreq.Model == "":
			return extproc.ErrNoWorker("no worker is registered")
		}
		return extproc.ErrNoWorker(fmt.Sprintf("no worker serves model %q", pl.sreq.Model))
	}
	return nil
}

// tokenize returns the prompt's token ids as the model server will see
// them, or nil (routing by load) with pl.byLoad saying why. Encoded ids go
// into *buf (grown there), so they are only valid until buf is released.
// The error is ctx's, when it ended.
func (p *Picker) tokenize(ctx context.Context, pl *plan, oa *tokenizer.Request, buf *[]uint32, body []byte) ([]uint32, error) {
	ids := p.tokenizeCapped(ctx, pl, oa, buf, body)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return ids, nil
}

func (p *Picker) tokenizeCapped(ctx context.Context, pl *plan, oa *tokenizer.Request, buf *[]uint32, body []byte) []uint32 {
	if pl.byLoad != "" {
		return nil
	}
	switch pl.api {
	case APIOther:
		pl.byLoad = "other_path"
		return nil
	case APICompletion:
		prompt, ok := routePrompt(oa)
		if !ok {
			pl.byLoad = "no_prompt"
			return nil
		}
		if prompt.IsIDs {
			return prompt.IDs // token ids need no tokenizer
		}
		if p.cfg.MaxPromptBytes > 0 && len(prompt.Text) > p.cfg.MaxPromptBytes {
			pl.byLoad = "prompt_too_large"
			return nil
		}
	case APIChat:
		if p.cfg.MaxMessages > 0 && oa.Messages > p.cfg.MaxMessages {
			pl.byLoad = "too_many_messages"
			return nil
		}
	}
	base := ""
	if len(pl.bases) > 0 {
		base = pl.bases[0] // an adapter name falls back to its base model
	}
	chat, err := lookupChat(p.cfg.Tokenizers, pl.sreq.Model, base)
	if err != nil {
		pl.byLoad = "tokenizer_error"
		p.log.Warn("tokenizer failed to load; routing by load", "model", pl.sreq.Model, "err", err)
		return nil
	}
	if chat == nil {
		pl.byLoad = "no_tokenizer"
		return nil
	}
	if pl.api == APICompletion {
		// vLLM tokenizes completion prompts with special tokens added.
		prompt, _ := routePrompt(oa)
		*buf = p.completions.appendEncode((*buf)[:0], chat, prompt.Text)
		return *buf
	}
	creq, err := oa.Chat()
	if err == nil && multimodal.HasImages(&creq) {
		return p.tokenizeImages(pl, chat, creq, buf, body, base)
	}
	if err == nil {
		var ids []uint32
		if ids, err = chat.AppendEncodeChatContext(ctx, (*buf)[:0], creq, p.cfg.MaxPromptBytes); err == nil {
			*buf = ids
			return ids
		}
	}
	switch {
	case ctx.Err() != nil:
		return nil
	case errors.Is(err, tokenizer.ErrPromptTooLarge):
		pl.byLoad = "prompt_too_large"
		return nil
	}
	pl.byLoad = "template_error"
	p.log.Debug("chat prompt not rendered; routing by load", "model", pl.sreq.Model, "err", err)
	return nil
}

// overlap hashes the prompt per (base model, block size) group of
// candidates and fills in their matched and cached blocks.
func (p *Picker) overlap(ctx context.Context, r *scoring.Scheduler, pl *plan, salt string, tokens []uint32) error {
	if len(tokens) == 0 {
		return nil
	}
	var m kvindex.Matcher
	switch r.Mode().Overlap() {
	case scoring.OverlapEvents:
		if p.cfg.Index != nil {
			m = p.cfg.Index
		}
	case scoring.OverlapApprox:
		if p.cfg.Approx != nil {
			m = p.cfg.Approx
		}
	}
	done := make([]bool, len(pl.cands))
	var ids []string
	var idx []int
	var res []kvindex.MatchResult
	for i := range pl.cands {
		if done[i] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		base, bs := pl.bases[i], pl.blockSize[i]
		ids, idx = ids[:0], idx[:0]
		for j := i; j < len(pl.cands); j++ {
			if !done[j] && pl.bases[j] == base && pl.blockSize[j] == bs {
				done[j] = true
				ids = append(ids, pl.cands[j].Worker)
				idx = append(idx, j)
			}
		}
		lora := ""
		if pl.sreq.Model != base {
			lora = pl.sreq.Model
		}
		hashes := kvindex.HashBlocksMM(kvindex.Seed(base, lora, salt), tokens, bs,
			kvindex.MMBlockKeys(pl.mm, len(tokens), bs), nil)
		if pl.sreq.Hashes == nil {
			pl.sreq.Hashes = hashes
		}
		if m == nil {
			continue
		}
		// A prompt shorter than a block is matched too: nothing is cached.
		pl.matched = true
		if len(hashes) == 0 {
			continue
		}
		res = m.Match(hashes, ids, res)
		for k, j := range idx {
			if res[k].Stale {
				// A stale view (a gap in the worker's events, awaiting its
				// resync) may hold blocks the worker evicted: its overlap is
				// unknown, so it gets no credit rather than a wrong one.
				pl.cands[j].CachedBlocks, pl.cands[j].Stale = int(res[k].Cached), true
				continue
			}
			pl.cands[j].MatchedBlocks, pl.cands[j].CachedBlocks = int(res[k].Blocks), int(res[k].Cached)
			pl.cands[j].HostBlocks, pl.cands[j].DiskBlocks = int(res[k].HostBlocks), int(res[k].DiskBlocks)
		}
	}
	return nil
}

// tokenizeImages encodes a chat with image parts for a declared
// vision-language model: each image expanded to its processor's tokens and
// placed, its identity derived and, with InjectUUID, written into the body
// upstream. Undeclared models and images the router cannot read are routed
// by load.
func (p *Picker) tokenizeImages(pl *plan, chat *tokenizer.Chat, creq tokenizer.ChatRequest, buf *[]uint32, body []byte, base string) []uint32 {
	mm, ok := p.multimodalModel(pl.sreq.Model, base)
	if !ok {
		pl.byLoad = "multimodal_undeclared"
		return nil
	}
	spec, err := p.mmSpecs.get(chat, mm.Processor)
	if err == nil {
		var enc multimodal.Encoded
		if enc, err = multimodal.EncodeChat(chat, spec, creq, (*buf)[:0]); err == nil {
			if mm.InjectUUID && body != nil {
				if pl.body, err = injectUUIDs(body, imageParts(&creq), enc.Items); err != nil {
					pl.body = nil
					p.log.Debug("image uuids not injected", "model", pl.sreq.Model, "err", err)
				}
			}
			*buf, pl.mm = enc.Tokens, enc.Placements
			return enc.Tokens
		}
	}
	pl.byLoad = "multimodal_error"
	p.log.Debug("images not placed; routing by load", "model", pl.sreq.Model, "err", err)
	return nil
}
