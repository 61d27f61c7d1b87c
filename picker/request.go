package picker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/extproc"
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

// parseBody decodes an OpenAI body once into the request model
// (tokenizer.Request) that every later step reads: the routing hints here,
// the prompt or the chat for tokenizing, the image parts for placement and
// uuid injection. A body that is not a JSON object wraps errNotJSON.
func parseBody(body []byte) (tokenizer.Request, error) {
	r, err := tokenizer.ParseRequest(body)
	if errors.Is(err, tokenizer.ErrJSONTooDeep) {
		return r, fmt.Errorf("%w: %w: %w", errNotJSON, errTooDeep, err)
	}
	if err != nil {
		return r, fmt.Errorf("%w: %w", errNotJSON, err)
	}
	return r, nil
}

// routePrompt is the completions prompt the router tokenizes: the first
// of a list decides the route. ok is false when there is none it can read.
func routePrompt(r *tokenizer.Request) (p tokenizer.Prompt, ok bool) {
	if len(r.Prompts) == 0 {
		return tokenizer.Prompt{}, false
	}
	return r.Prompts[0], true
}
