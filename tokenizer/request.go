package tokenizer

import (
	"errors"
	"fmt"
	"math"
)

// Request is an OpenAI completions or chat completions body as kvroute
// reads it: decoded once (ParseRequest), and read by every part that needs
// the body: the picker (model, routing hints, the prompt), the chat
// template (Chat), the multimodal encoder (Chat's image parts, each with
// its place in the body) and the render service. Fields of the wrong type
// are left at their zero value (the model server judges them); only the
// chat and the prompt say why they cannot be read.
type Request struct {
	// Model is "model"; "" when absent or not a string (BadModel).
	Model string
	// BadModel reports a "model" that is present but not a string.
	BadModel bool
	// CacheSalt is "cache_salt" (vLLM), "" when absent.
	CacheSalt string
	// Stream is "stream".
	Stream bool
	// MaxTokens is max_completion_tokens, else max_tokens, when a positive
	// integer (capped at math.MaxInt32); 0 otherwise.
	MaxTokens int
	// Priority is nvext.agent_hints.priority (Dynamo's agent hints) when
	// it is a finite number; HasPriority says it was.
	Priority    float64
	HasPriority bool
	// Messages is the length of "messages" when it is an array, else 0.
	Messages int
	// Prompts are a completions request's prompts, in order, as far as
	// they could be read (vLLM's forms: a string, a list of token ids, or a
	// list of strings and token id lists); an empty list reads as one empty
	// list of ids. PromptErr says why the rest could not be read: nil when
	// every prompt was, ErrNoPrompt without "prompt".
	Prompts   []Prompt
	PromptErr error

	// top is the decoded body; the chat is read from it on first use.
	top      Object
	imageAt  map[*Field]int
	chat     ChatRequest
	chatErr  error
	chatRead bool
}

// Prompt is one completions prompt: text to tokenize, or token ids.
type Prompt struct {
	Text  string
	IDs   []uint32
	IsIDs bool
}

// ErrNoPrompt is Request.PromptErr for a body without "prompt".
var ErrNoPrompt = errors.New("prompt is missing")

// ErrNotObject is wrapped by ParseRequest's error for a body that is valid
// JSON but not an object.
var ErrNotObject = errors.New("not a JSON object")

// ParseRequest decodes an OpenAI request body once, keeping object key
// order (the template sees the body's own order), and reads the fields
// kvroute uses. The error is the JSON decoder's (ErrJSONTooDeep among
// them) or wraps ErrNotObject; a body that decodes never fails, whatever
// its fields hold.
func ParseRequest(body []byte) (Request, error) {
	d := jsonDecoder{data: body, trackImages: true}
	v, err := d.document()
	if err != nil {
		return Request{}, err
	}
	top, ok := v.(Object)
	if !ok {
		return Request{}, fmt.Errorf("%w: the body is a JSON %s", ErrNotObject, jsonKind(v))
	}
	r := Request{top: top, imageAt: d.imageAt}
	if m, ok := top.Get("model"); ok {
		r.Model, ok = m.(string)
		r.BadModel = !ok
	}
	if s, ok := top.Get("cache_salt"); ok {
		r.CacheSalt, _ = s.(string)
	}
	if s, ok := top.Get("stream"); ok {
		r.Stream, _ = s.(bool)
	}
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		if n, ok := jsonInt(top, k); ok && n > 0 {
			r.MaxTokens = int(min(n, math.MaxInt32))
			break
		}
	}
	if nv, ok := jsonObject(top, "nvext"); ok {
		if hints, ok := jsonObject(nv, "agent_hints"); ok {
			r.Priority, r.HasPriority = jsonNumber(hints, "priority")
		}
	}
	if p, ok := top.Get("prompt"); ok {
		r.Prompts, r.PromptErr = readPrompts(p)
	} else {
		r.PromptErr = ErrNoPrompt
	}
	if m, ok := top.Get("messages"); ok {
		if list, ok := m.([]any); ok {
			r.Messages = len(list)
		}
	}
	return r, nil
}

// Chat is the request's chat, normalized as vLLM normalizes it for the
// template (ChatRequestFromObject), with each image part's Offset in the
// body. It is read on first use and kept: a request routed before its
// prompt is rendered (too many messages, no tokenizer for the model) does
// not pay for it. The error says why the messages cannot be rendered.
func (r *Request) Chat() (ChatRequest, error) {
	if !r.chatRead {
		r.chat, r.chatErr = chatRequestFromObject(r.top, r.imageAt)
		r.chatRead = true
	}
	return r.chat, r.chatErr
}

// readPrompts reads a completions prompt: a string, a token id list, or a
// non-empty list of strings or of token id lists. It returns the prompts it
// could read before the first it could not.
func readPrompts(p any) ([]Prompt, error) {
	switch x := p.(type) {
	case string:
		return []Prompt{{Text: x}}, nil
	case []any:
		if len(x) == 0 {
			return []Prompt{{IDs: []uint32{}, IsIDs: true}}, errors.New("prompt is an empty list")
		}
		if _, isNum := x[0].(int64); isNum {
			ids, err := readIDs(x)
			if err != nil {
				return nil, err
			}
			return []Prompt{{IDs: ids, IsIDs: true}}, nil
		}
		out := make([]Prompt, 0, len(x))
		for i, e := range x {
			switch y := e.(type) {
			case string:
				out = append(out, Prompt{Text: y})
			case []any:
				ids, err := readIDs(y)
				if err != nil {
					return out, fmt.Errorf("prompt %d: %w", i, err)
				}
				out = append(out, Prompt{IDs: ids, IsIDs: true})
			default:
				return out, fmt.Errorf("prompt %d is neither a string nor a list of token ids", i)
			}
		}
		return out, nil
	}
	return nil, errors.New("prompt is neither a string nor a list")
}

func readIDs(list []any) ([]uint32, error) {
	ids := make([]uint32, 0, len(list))
	for _, e := range list {
		n, ok := e.(int64)
		if !ok || n < 0 || n > math.MaxUint32 {
			return nil, errors.New("token ids must be integers in 0..4294967295")
		}
		ids = append(ids, uint32(n))
	}
	return ids, nil
}

// jsonInt reads a non-negative integer: an int64, or a float64 that is a
// whole number below 2^53.
func jsonInt(o Object, key string) (int64, bool) {
	v, ok := o.Get(key)
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return n, true
	case float64:
		if n == math.Trunc(n) && n >= 0 && n < 1<<53 {
			return int64(n), true
		}
	}
	return 0, false
}

// jsonNumber reads a finite number.
func jsonNumber(o Object, key string) (float64, bool) {
	v, ok := o.Get(key)
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		if !math.IsNaN(n) && !math.IsInf(n, 0) {
			return n, true
		}
	}
	return 0, false
}

func jsonObject(o Object, key string) (Object, bool) {
	v, ok := o.Get(key)
	if !ok {
		return nil, false
	}
	obj, ok := v.(Object)
	return obj, ok
}
