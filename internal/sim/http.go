package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/kvindex"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 64 << 20

// PredictedCachedTokensHeader is the request header in which kvroute tells
// the worker how many prompt tokens it expects the worker to hold. kvsim
// echoes it in a response header of the same name and in the usage chunk
// ("kvroute_predicted_cached_tokens"), so a client can compare the
// router's prediction with usage.prompt_tokens_details.cached_tokens.
const PredictedCachedTokensHeader = "x-kvroute-predicted-cached-tokens"

// predictedCachedTokens reads PredictedCachedTokensHeader; nil when absent
// or not a non-negative integer.
func predictedCachedTokens(h http.Header) *int {
	v := h.Get(PredictedCachedTokensHeader)
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return nil
	}
	return &n
}

// Handler returns the worker's HTTP API: the OpenAI endpoints, /health and
// /metrics.
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(rw http.ResponseWriter, r *http.Request) { w.serveGenerate(rw, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(rw http.ResponseWriter, r *http.Request) { w.serveGenerate(rw, r, true) })
	mux.HandleFunc("GET /v1/models", w.serveModels)
	mux.HandleFunc("GET /health", func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.metrics.reg, promhttp.HandlerOpts{}))
	return mux
}

func (w *Worker) serveModels(rw http.ResponseWriter, _ *http.Request) {
	writeJSON(rw, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: w.cfg.Model, Object: "model", Created: w.created, OwnedBy: "kvsim", Root: w.cfg.Model,
		MaxModelLen: w.cfg.Engine.TotalTokens(),
	}}})
}

func writeJSON(rw http.ResponseWriter, code int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(v)
}

func writeError(rw http.ResponseWriter, code int, typ, msg string) {
	writeJSON(rw, code, apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
}

// prompt tokenizes the request as vLLM would.
// The result has room for extra generated tokens, which the engine appends.
func (w *Worker) prompt(body []byte, req apiRequest, chat bool, extra int) ([]int32, []kvindex.MMPlacement, error) {
	var ids []uint32
	var mm []kvindex.MMPlacement
	var err error
	if chat {
		if len(req.Messages) == 0 {
			return nil, nil, fmt.Errorf("%w: messages is required", errBadRequest)
		}
		if me, ok := w.encoder.(MMEncoder); ok {
			ids, mm, err = me.EncodeChatMM(body)
		} else {
			ids, err = w.encoder.EncodeChat(body)
		}
	} else {
		p, perr := parsePrompt(req.Prompt)
		if perr != nil {
			return nil, nil, perr
		}
		if p.isIDs {
			return p.tokens, nil, nil
		}
		ids, err = w.encoder.EncodeCompletion(p.text)
	}
	if err != nil {
		if errors.Is(err, errBadRequest) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	out := make([]int32, len(ids), len(ids)+extra)
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, mm, nil
}

func (w *Worker) serveGenerate(rw http.ResponseWriter, r *http.Request, chat bool) {
	arrived := time.Now()
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBodyBytes))
	if err != nil {
		writeError(rw, http.StatusBadRequest, "BadRequestError", "reading body: "+err.Error())
		return
	}
	req, err := parseAPIRequest(body)
	if err != nil {
		writeError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	if req.Model != "" && req.Model != w.cfg.Model {
		writeError(rw, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	def := 16
	if chat {
		def = w.cfg.DefaultMaxTokens
	}
	maxTokens, err := req.maxTokens(def)
	if err != nil {
		writeError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	prompt, mm, err := w.prompt(body, req, chat, maxTokens)
	if err != nil {
		writeError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	if len(prompt) == 0 {
		writeError(rw, http.StatusBadRequest, "BadRequestError", "the prompt is empty")
		return
	}
	if limit := w.cfg.Engine.TotalTokens(); len(prompt)+maxTokens > limit {
		writeError(rw, http.StatusBadRequest, "BadRequestError", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion).",
			limit, len(prompt)+maxTokens, len(prompt), maxTokens))
		return
	}
	eos := false
	if !req.IgnoreEOS && w.cfg.EOSProbability > 0 {
		if n := eosLength(prompt, w.cfg.EOSProbability, maxTokens); n < maxTokens {
			maxTokens, eos = n, true
		}
	}
	id := w.nextID.Add(1)
	st := newStream(maxTokens)
	w.run.submit(command{kind: cmdAdd, id: id, prompt: prompt, max: maxTokens, st: st, mm: mm})
	g := &generation{w: w, rw: rw, chat: chat, stream: req.Stream, arrived: arrived, max: maxTokens, eos: eos,
		predicted: predictedCachedTokens(r.Header)}
	if g.predicted != nil {
		rw.Header().Set(PredictedCachedTokensHeader, strconv.Itoa(*g.predicted))
	}
	if chat {
		g.id = "chatcmpl-" + w.cfg.ID + "-" + strconv.FormatUint(id, 10)
	} else {
		g.id = "cmpl-" + w.cfg.ID + "-" + strconv.FormatUint(id, 10)
	}
	if err := g.follow(r, st); err != nil {
		w.run.submit(command{kind: cmdAbort, id: id})
		w.metrics.aborted.Inc()
		w.log.Debug("request aborted", "id", g.id, "err", err)
	}
}

// generation writes one request's response as its tokens arrive.
type generation struct {
	w       *Worker
	rw      http.ResponseWriter
	bw      *bufio.Writer
	flusher http.Flusher
	chat    bool
	stream  bool
	id      string
	arrived time.Time
	last    time.Time
	max     int
	eos     bool // the output ends at a simulated EOS, not at max_tokens
	// predicted is the router's cached-tokens prediction, echoed back.
	predicted *int
	text      strings.Builder
	n         int
}

// follow waits for tokens and writes them; an error means the request must
// be aborted (client gone or worker stopped).
func (g *generation) follow(r *http.Request, st *stream) error {
	created := g.arrived.Unix()
	if g.stream {
		h := g.rw.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		// Like vLLM's server: the headers at once, the first event (the
		// chat's role) with the first token.
		g.rw.WriteHeader(http.StatusOK)
		g.bw = bufio.NewWriterSize(g.rw, 4096)
		g.flusher, _ = g.rw.(http.Flusher)
		if err := g.flush(); err != nil {
			return err
		}
	}
	var buf []int32
	var tbuf []time.Time
	for {
		select {
		case <-st.notify:
		case <-r.Context().Done():
			return r.Context().Err()
		}
		snap := st.since(g.n, buf, tbuf)
		buf, tbuf = snap.tokens, snap.times
		if snap.err != nil {
			if !g.stream {
				writeError(g.rw, http.StatusServiceUnavailable, "ServiceUnavailableError", snap.err.Error())
			} else {
				g.event(apiError{Error: apiErrorBody{Message: snap.err.Error(), Type: "ServiceUnavailableError", Code: 503}})
				_ = g.flush()
			}
			return snap.err
		}
		g.observe(snap.times)
		if g.stream && g.chat && g.n == 0 && len(snap.tokens) > 0 {
			g.event(chatResponse{ID: g.id, Object: "chat.completion.chunk", Created: created, Model: g.w.cfg.Model,
				Choices: []chatChoice{{Delta: &chatMessage{Role: "assistant", Content: ""}}}})
		}
		for i, tok := range snap.tokens {
			last := snap.finished && i == len(snap.tokens)-1
			g.token(tok, last, created, snap.times[i])
		}
		g.n += len(snap.tokens)
		if g.stream && len(snap.tokens) > 0 {
			if err := g.flush(); err != nil {
				return err
			}
		}
		if snap.finished {
			return g.finish(snap, created)
		}
	}
}

// observe records TTFT and inter-token latencies from the times the worker
// produced the new tokens.
func (g *generation) observe(times []time.Time) {
	m := g.w.metrics
	for i, at := range times {
		if g.n == 0 && i == 0 {
			m.ttft.Observe(at.Sub(g.arrived).Seconds())
		} else {
			m.itl.Observe(at.Sub(g.last).Seconds())
		}
		g.last = at
	}
}

// Finish reasons: "length" at max_tokens, "stop" at a simulated EOS.
var (
	finishLength = "length"
	finishStop   = "stop"
)

func (g *generation) finishReason() *string {
	if g.eos {
		return &finishStop
	}
	return &finishLength
}

// token writes one token; at is when the worker produced it, stamped on
// the chunk because chunks written together reach the client together.
func (g *generation) token(tok int32, last bool, created int64, at time.Time) {
	text := tokenText(tok)
	if !g.stream {
		g.text.WriteString(text)
		return
	}
	var fr *string
	if last {
		fr = g.finishReason()
	}
	if g.chat {
		g.event(chatResponse{ID: g.id, Object: "chat.completion.chunk", Created: created, Model: g.w.cfg.Model,
			Choices: []chatChoice{{Delta: &chatMessage{Content: text}, FinishReason: fr}}, EmitTime: at.UnixNano()})
	} else {
		g.event(completionResponse{ID: g.id, Object: "text_completion", Created: created, Model: g.w.cfg.Model,
			Choices: []completionChoice{{Text: text, FinishReason: fr}}, EmitTime: at.UnixNano()})
	}
}

func (g *generation) finish(snap snapshot, created int64) error {
	m := g.w.metrics
	m.e2e.Observe(time.Since(g.arrived).Seconds())
	m.promptToks.Add(float64(snap.promptTokens))
	m.genToks.Add(float64(g.n))
	m.success.Inc()
	u := &usage{
		PromptTokens: snap.promptTokens, CompletionTokens: g.n, TotalTokens: snap.promptTokens + g.n,
		PromptTokensDetails: &promptDetail{CachedTokens: snap.cachedTokens},
	}
	if g.stream {
		// vLLM sends usage in a last chunk with no choices when
		// stream_options.include_usage is set; kvsim always does.
		if g.chat {
			g.event(chatResponse{ID: g.id, Object: "chat.completion.chunk", Created: created, Model: g.w.cfg.Model,
				Choices: []chatChoice{}, Usage: u, PredictedCachedTokens: g.predicted})
		} else {
			g.event(completionResponse{ID: g.id, Object: "text_completion", Created: created, Model: g.w.cfg.Model,
				Choices: []completionChoice{}, Usage: u, PredictedCachedTokens: g.predicted})
		}
		_, _ = g.bw.WriteString("data: [DONE]\n\n")
		return g.flush()
	}
	if g.chat {
		writeJSON(g.rw, http.StatusOK, chatResponse{ID: g.id, Object: "chat.completion", Created: created, Model: g.w.cfg.Model,
			Choices: []chatChoice{{Message: &chatMessage{Role: "assistant", Content: g.text.String()}, FinishReason: g.finishReason()}},
			Usage:   u, PredictedCachedTokens: g.predicted})
	} else {
		writeJSON(g.rw, http.StatusOK, completionResponse{ID: g.id, Object: "text_completion", Created: created, Model: g.w.cfg.Model,
			Choices: []completionChoice{{Text: g.text.String(), FinishReason: g.finishReason()}}, Usage: u,
			PredictedCachedTokens: g.predicted})
	}
	return nil
}

// event writes one SSE event: "data: <json>\n\n".
func (g *generation) event(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = g.bw.WriteString("data: ")
	_, _ = g.bw.Write(data)
	_, _ = g.bw.WriteString("\n\n")
}

func (g *generation) flush() error {
	if err := g.bw.Flush(); err != nil {
		return fmt.Errorf("write to client: %w", err)
	}
	if g.flusher != nil {
		g.flusher.Flush()
	}
	return nil
}

// eosLength is where a request without ignore_eos samples EOS when each
// token is EOS with probability p: deterministic per prompt, at least 1,
// and max when no EOS comes earlier.
func eosLength(prompt []int32, p float64, max int) int {
	if p >= 1 {
		return 1
	}
	seed := uint64(blockHash(0, prompt))
	threshold := uint64(p * (1 << 63) * 2)
	for i := 1; i < max; i++ {
		if avalanche(seed+uint64(i)*seedMix) < threshold {
			return i
		}
	}
	return max
}
