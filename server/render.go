package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/tokenizer"
)

// Paths of vLLM's render API that the render listener (--render-addr)
// answers. An engine that tokenizes through a render service
// (llm-d-inference-sim --render-url) then sees exactly the token ids the
// router hashes, so the blocks its KV events report are the ones routing
// looks for.
const (
	RenderCompletionsPath = "/v1/completions/render"
	RenderChatPath        = "/v1/chat/completions/render"
)

// maxRenderBody bounds one render request body.
const maxRenderBody = 16 << 20

// renderKind is which render endpoint a request came to.
type renderKind int

const (
	renderChat renderKind = iota
	renderCompletions
)

// renderRequest is a render body checked at the edge.
type renderRequest struct {
	model   string
	chat    tokenizer.ChatRequest // renderChat
	prompts []tokenizer.Prompt    // renderCompletions, at least one
}

// renderResponse is one rendered prompt as vLLM's render endpoints answer:
// the chat endpoint sends one, the completions endpoint a list of them.
type renderResponse struct {
	TokenIDs []uint32 `json:"token_ids"`
}

// decodeRenderRequest reads a chat or completions body as the render
// endpoints take it (the body the engine would get), through the request
// model the picker reads too (tokenizer.ParseRequest). Only the fields
// that decide the prompt matter: model, and messages (with tools,
// add_generation_prompt, continue_final_message and chat_template_kwargs)
// or prompt (a string, token ids, or a list of either), every one of
// which must be readable.
func decodeRenderRequest(kind renderKind, body []byte) (renderRequest, *extproc.HTTPError) {
	var r renderRequest
	req, err := tokenizer.ParseRequest(body)
	if errors.Is(err, tokenizer.ErrNotObject) {
		return r, badRequest("invalid_json", "request body is not a JSON object")
	}
	if err != nil {
		return r, badRequest("invalid_json", "request body is not valid JSON")
	}
	if req.BadModel {
		return r, badRequest("invalid_model", "model is not a string")
	}
	r.model = req.Model
	if kind == renderChat {
		if r.chat, err = req.Chat(); err != nil {
			return r, badRequest("invalid_messages", err.Error())
		}
		for _, m := range r.chat.Messages {
			if len(m.Images) > 0 {
				return r, &extproc.HTTPError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "unsupported_content",
					Message: "the router's render service renders text only; image parts are not rendered"}
			}
		}
		return r, nil
	}
	if req.PromptErr != nil {
		return r, badRequest("invalid_prompt", req.PromptErr.Error())
	}
	r.prompts = req.Prompts
	return r, nil
}

// renderHandler serves vLLM's render API from the router's tokenizers.
func (r *Server) renderHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(RenderChatPath, func(w http.ResponseWriter, req *http.Request) { r.serveRender(w, req, renderChat) })
	mux.HandleFunc(RenderCompletionsPath, func(w http.ResponseWriter, req *http.Request) { r.serveRender(w, req, renderCompletions) })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: "the render listener serves POST " + RenderChatPath + " and " + RenderCompletionsPath})
	})
	return mux
}

func (r *Server) serveRender(w http.ResponseWriter, req *http.Request, kind renderKind) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &extproc.HTTPError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed", Message: "use POST"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxRenderBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, &extproc.HTTPError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "body_too_large",
				Message: fmt.Sprintf("request body is over %d bytes", maxRenderBody)})
			return
		}
		writeError(w, badRequest("unreadable_body", "request body could not be read"))
		return
	}
	rr, herr := decodeRenderRequest(kind, body)
	if herr == nil {
		var out any
		if out, herr = r.render(req.Context(), kind, rr); herr == nil {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(out)
			return
		}
	}
	writeError(w, herr)
}

// render tokenizes a checked request with the model's tokenizer exactly as
// the picker does for routing: chats through the chat template, completion
// prompts with special tokens added, token ids as given.
func (r *Server) render(ctx context.Context, kind renderKind, rr renderRequest) (any, *extproc.HTTPError) {
	model := rr.model
	if model == "" {
		if models := r.toks.Models(); len(models) == 1 {
			model = models[0] // vLLM serves one model; a request may leave it out
		}
	}
	chat, err := r.toks.Get(model)
	if err != nil {
		if errors.Is(err, tokenizer.ErrUnknownModel) {
			return nil, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
				Message: fmt.Sprintf("the router has no tokenizer for model %q", model)}
		}
		return nil, &extproc.HTTPError{Status: http.StatusInternalServerError, Type: "internal_error", Code: "tokenizer_error",
			Message: "the model's tokenizer failed to load", Err: err}
	}
	if kind == renderChat {
		ids, err := chat.AppendEncodeChatContext(ctx, nil, rr.chat, r.cfg.MaxPromptBytes)
		if err != nil {
			if errors.Is(err, tokenizer.ErrPromptTooLarge) {
				return nil, &extproc.HTTPError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "prompt_too_large",
					Message: "the rendered prompt is over the router's --max-prompt-bytes"}
			}
			return nil, badRequest("template_error", "the chat template could not render the messages")
		}
		return renderResponse{TokenIDs: nonNil(ids)}, nil
	}
	out := make([]renderResponse, len(rr.prompts))
	for i, p := range rr.prompts {
		if p.IsIDs {
			out[i].TokenIDs = nonNil(p.IDs)
			continue
		}
		if r.cfg.MaxPromptBytes > 0 && len(p.Text) > r.cfg.MaxPromptBytes {
			return nil, &extproc.HTTPError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "prompt_too_large",
				Message: "a prompt is over the router's --max-prompt-bytes"}
		}
		out[i].TokenIDs = nonNil(chat.Tokenizer().Encode(p.Text, true))
	}
	return out, nil
}

// nonNil keeps an empty prompt's ids a JSON [] rather than null.
func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}

// RenderAddr is the bound render listener's address, or "" when disabled.
func (r *Server) RenderAddr() string {
	if r.renderLis == nil {
		return ""
	}
	return r.renderLis.Addr().String()
}
