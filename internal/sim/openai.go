package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// apiRequest is the part of an OpenAI completions or chat completions body
// the simulator reads. Everything else is accepted and ignored.
type apiRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	N                   *int            `json:"n"`
}

// errBadRequest marks errors that become HTTP 400.
var errBadRequest = errors.New("bad request")

func parseAPIRequest(body []byte) (apiRequest, error) {
	var req apiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return apiRequest{}, fmt.Errorf("%w: body is not a JSON object: %w", errBadRequest, err)
	}
	if req.N != nil && *req.N != 1 {
		return apiRequest{}, fmt.Errorf("%w: n=%d: the simulator generates one choice per request", errBadRequest, *req.N)
	}
	return req, nil
}

// maxTokens returns the requested output length, or def when absent.
func (r apiRequest) maxTokens(def int) (int, error) {
	p := r.MaxCompletionTokens
	if p == nil {
		p = r.MaxTokens
	}
	if p == nil {
		return def, nil
	}
	if *p < 1 {
		return 0, fmt.Errorf("%w: max_tokens must be at least 1, got %d", errBadRequest, *p)
	}
	return *p, nil
}

// completionPrompt is a completions "prompt": text, or token ids taken as is.
type completionPrompt struct {
	text   string
	tokens []int32
	isIDs  bool
}

// parsePrompt accepts a string, a list of token ids, or a one-element list
// of either. Batched prompts are not supported.
func parsePrompt(raw json.RawMessage) (completionPrompt, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return completionPrompt{}, fmt.Errorf("%w: prompt is required", errBadRequest)
	}
	// Decode once, into the type the first bytes announce.
	var s string
	if raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return completionPrompt{text: s}, nil
	}
	if ids, ok := scanIDs(raw); ok {
		if len(ids) == 0 {
			return completionPrompt{}, fmt.Errorf("%w: prompt has no tokens", errBadRequest)
		}
		return completionPrompt{tokens: ids, isIDs: true}, nil
	}
	var ids []int64
	if inner := bytes.TrimLeft(raw[1:], " \t\r\n"); raw[0] == '[' && len(inner) > 0 && inner[0] != '[' && inner[0] != '"' &&
		json.Unmarshal(raw, &ids) == nil {
		return idsPrompt(ids)
	}
	var nested []json.RawMessage
	if json.Unmarshal(raw, &nested) == nil && len(nested) == 1 {
		var inner []int64
		if json.Unmarshal(nested[0], &inner) == nil {
			return idsPrompt(inner)
		}
		if json.Unmarshal(nested[0], &s) == nil {
			return completionPrompt{text: s}, nil
		}
	}
	return completionPrompt{}, fmt.Errorf("%w: prompt must be a string, a list of token ids, or a one-element list of either", errBadRequest)
}

func idsPrompt(ids []int64) (completionPrompt, error) {
	if len(ids) == 0 {
		return completionPrompt{}, fmt.Errorf("%w: prompt has no tokens", errBadRequest)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return completionPrompt{}, fmt.Errorf("%w: token id %d out of range", errBadRequest, id)
		}
		out[i] = int32(id)
	}
	return completionPrompt{tokens: out, isIDs: true}, nil
}

// Response shapes, as vLLM's OpenAI server writes them.
type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	PromptTokensDetails *promptDetail `json:"prompt_tokens_details"`
}

type promptDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
	// EmitTime and PredictedCachedTokens are kvsim's extensions; see
	// chatResponse.
	EmitTime              int64 `json:"kvsim_t,omitempty"`
	PredictedCachedTokens *int  `json:"kvroute_predicted_cached_tokens,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	// EmitTime is when the worker produced the chunk's token, in Unix
	// nanoseconds (streamed token chunks only): clients that receive several
	// chunks in one read measure inter-token latency from it. OpenAI clients
	// ignore unknown fields.
	EmitTime int64 `json:"kvsim_t,omitempty"`
	// PredictedCachedTokens echoes the router's x-kvroute-predicted-cached-tokens
	// request header in the usage chunk (and the non-streamed response).
	PredictedCachedTokens *int `json:"kvroute_predicted_cached_tokens,omitempty"`
}

type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root"`
	MaxModelLen int    `json:"max_model_len"`
}

// outputWords give generated tokens deterministic text. The token ids are
// what the KV cache holds; the text is only for clients to read.
var outputWords = [...]string{" the", " of", " and", " to", " in", " a", " is", " that", " for", " it",
	" as", " was", " with", " be", " by", " on", " not", " he", " this", " are",
	" or", " his", " from", " at", " which", " but", " have", " an", " had", " they",
	" you", " were"}

func tokenText(tok int32) string { return outputWords[uint32(tok)%uint32(len(outputWords))] }

// scanIDs is the fast path for the common token-id prompt: a JSON array of
// non-negative integers that fit int32, without exponents or fractions. It
// reports false for anything else, which then goes through encoding/json.
func scanIDs(raw []byte) ([]int32, bool) {
	i, n := 0, len(raw)
	skip := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\r' || raw[i] == '\n') {
			i++
		}
	}
	skip()
	if i == n || raw[i] != '[' {
		return nil, false
	}
	i++
	ids := make([]int32, 0, len(raw)/4)
	skip()
	if i < n && raw[i] == ']' {
		i++
		skip()
		return ids, i == n
	}
	for {
		skip()
		start := i
		var v int64
		for i < n && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + int64(raw[i]-'0')
			if v > math.MaxInt32 {
				return nil, false
			}
			i++
		}
		// JSON forbids leading zeros ("01"); leave odd forms to encoding/json.
		if i == start || (i-start > 1 && raw[start] == '0') {
			return nil, false
		}
		ids = append(ids, int32(v))
		skip()
		if i == n {
			return nil, false
		}
		if raw[i] == ']' {
			i++
			skip()
			return ids, i == n
		}
		if raw[i] != ',' {
			return nil, false
		}
		i++
	}
}
