package extproc

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/tokenizer"
)

// Tokenizers maps model names (base models and LoRA adapters) to the chat
// tokenizer that reproduces the model server's prompt tokens. A model
// without one is routed by load, never rejected.
type Tokenizers struct {
	byModel map[string]*tokenizer.Chat
}

// NewTokenizers wraps a ready map; the map must not change afterwards.
func NewTokenizers(byModel map[string]*tokenizer.Chat) *Tokenizers {
	if byModel == nil {
		byModel = map[string]*tokenizer.Chat{}
	}
	return &Tokenizers{byModel: byModel}
}

// LoadTokenizers loads "MODEL=DIR" specs (the --tokenizer flag): DIR holds
// tokenizer.json and tokenizer_config.json. One DIR serving several model
// names is loaded once.
func LoadTokenizers(specs []string, opts tokenizer.ChatOptions) (*Tokenizers, error) {
	byDir := map[string]*tokenizer.Chat{}
	m := make(map[string]*tokenizer.Chat, len(specs))
	for _, spec := range specs {
		model, dir, ok := strings.Cut(spec, "=")
		if !ok || model == "" || dir == "" {
			return nil, fmt.Errorf("tokenizer %q: want MODEL=DIR", spec)
		}
		c, ok := byDir[dir]
		if !ok {
			var err error
			if c, err = tokenizer.LoadChat(dir, "", opts); err != nil {
				return nil, fmt.Errorf("tokenizer for %s: %w", model, err)
			}
			byDir[dir] = c
		}
		m[model] = c
	}
	return NewTokenizers(m), nil
}

// Lookup returns the tokenizer for model, trying each name in order (an
// adapter name, then its base model).
func (t *Tokenizers) Lookup(models ...string) (*tokenizer.Chat, bool) {
	if t == nil {
		return nil, false
	}
	for _, m := range models {
		if c, ok := t.byModel[m]; ok {
			return c, true
		}
	}
	return nil, false
}

// Models lists the models with a tokenizer, sorted.
func (t *Tokenizers) Models() []string {
	if t == nil {
		return nil
	}
	out := make([]string, 0, len(t.byModel))
	for m := range t.byModel {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}
