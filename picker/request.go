package picker

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer"
)

// API is the kind of OpenAI request a path names.
type API string

// APIs the router tokenizes; everything else is routed by load.
const (
	APIChat       API = "chat"
	APICompletion API = "completion"
	APIOther      API = "other"
)

// apiOf maps a request path (query string allowed) to its API.
func apiOf(path string) API {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return APIChat
	case strings.HasSuffix(path, "/v1/completions"):
		return APICompletion
	}
	return APIOther
}

// errNotJSON marks a body that is not a JSON object.
var errNotJSON = errors.New("request body is not a JSON object")

// errTooDeep is the client's answer for valid JSON nested past the
// decoder's limit: "not a valid JSON object" would send them looking for a
// syntax error that is not there.
var errTooDeep = extproc.ErrBadBody(fmt.Sprintf("request body nests JSON deeper than the router's limit of %d levels", tokenizer.MaxJSONDepth), tokenizer.ErrJSONTooDeep)

// openAIRequest is what the router reads from an OpenAI body.
type openAIRequest struct {
	api       API
	model     string
	cacheSalt string
	stream    bool
	// maxTokens is max_tokens or max_completion_tokens; 0 when absent.
	maxTokens int
	// priority is nvext.agent_hints.priority; hasPriority says it was set.
	priority    float64
	hasPriority bool
	top         tokenizer.Object
	// For completions: the prompt as text, or as token ids.
	promptText string
	promptIDs  []uint32
	hasIDs     bool
	hasPrompt  bool
	// messages is the length of a chat's messages list (0 when absent).
	messages int
}

// parseOpenAI decodes body for api. A body that is not a JSON object
// wraps errNotJSON; fields of the wrong type are ignored (the model server
// will judge them), except that a prompt the router cannot read leaves
// hasPrompt false.
func parseOpenAI(api API, body []byte) (openAIRequest, error) {
	r := openAIRequest{api: api}
	v, err := tokenizer.DecodeJSON(body)
	if errors.Is(err, tokenizer.ErrJSONTooDeep) {
		return r, fmt.Errorf("%w: %w: %w", errNotJSON, errTooDeep, err)
	}
	if err != nil {
		return r, fmt.Errorf("%w: %w", errNotJSON, err)
	}
	top, ok := v.(tokenizer.Object)
	if !ok {
		return r, fmt.Errorf("%w: top-level value is %T", errNotJSON, v)
	}
	r.top = top
	r.model, _ = getString(top, "model")
	r.cacheSalt, _ = getString(top, "cache_salt")
	if s, ok := top.Get("stream"); ok {
		r.stream, _ = s.(bool)
	}
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		if n, ok := getInt(top, k); ok && n > 0 {
			r.maxTokens = int(min(n, math.MaxInt32))
			break
		}
	}
	if nv, ok := getObject(top, "nvext"); ok {
		if hints, ok := getObject(nv, "agent_hints"); ok {
			if p, ok := getNumber(hints, "priority"); ok {
				r.priority, r.hasPriority = scoring.ClampPriority(p), true
			}
		}
	}
	if api == APICompletion {
		r.readPrompt()
	}
	if m, ok := top.Get("messages"); ok {
		if list, ok := m.([]any); ok {
			r.messages = len(list)
		}
	}
	return r, nil
}

// readPrompt reads a completions prompt: a string, a token-id array, or a
// list of either, of which the first element decides the route.
func (r *openAIRequest) readPrompt() {
	p, ok := r.top.Get("prompt")
	if !ok {
		return
	}
	if list, ok := p.([]any); ok && len(list) > 0 {
		switch list[0].(type) {
		case string, []any:
			p = list[0]
		}
	}
	switch x := p.(type) {
	case string:
		r.promptText, r.hasPrompt = x, true
	case []any:
		ids := make([]uint32, 0, len(x))
		for _, e := range x {
			n, ok := e.(int64)
			if !ok || n < 0 || n > math.MaxUint32 {
				return
			}
			ids = append(ids, uint32(n))
		}
		r.promptIDs, r.hasIDs, r.hasPrompt = ids, true, true
	}
}

func getString(o tokenizer.Object, key string) (string, bool) {
	v, ok := o.Get(key)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

func getInt(o tokenizer.Object, key string) (int64, bool) {
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

func getNumber(o tokenizer.Object, key string) (float64, bool) {
	v, ok := o.Get(key)
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, !math.IsNaN(n) && !math.IsInf(n, 0)
	}
	return 0, false
}

func getObject(o tokenizer.Object, key string) (tokenizer.Object, bool) {
	v, ok := o.Get(key)
	if !ok {
		return nil, false
	}
	obj, ok := v.(tokenizer.Object)
	return obj, ok
}
