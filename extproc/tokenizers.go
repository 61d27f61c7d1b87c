package extproc

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/tokenizer"
)

// Tokenizers maps model names (base models and LoRA adapters) to the chat
// tokenizer that reproduces the model server's prompt tokens. A model
// without one is routed by load, never rejected.
type Tokenizers struct {
	byModel map[string]*tokenizer.Chat
	mu      sync.Mutex
	special map[*tokenizer.Chat]*completionSpecials
}

// completionSpecials is how a tokenizer's post-processor frames a single
// sequence: when it only prepends tokens (BOS), completion prompts can go
// through the prefix cache with those tokens in front.
type completionSpecials struct {
	prefix     []uint32
	prefixOnly bool
}

// NewTokenizers wraps a ready map; the map must not change afterwards.
func NewTokenizers(byModel map[string]*tokenizer.Chat) *Tokenizers {
	if byModel == nil {
		byModel = map[string]*tokenizer.Chat{}
	}
	return &Tokenizers{byModel: byModel, special: map[*tokenizer.Chat]*completionSpecials{}}
}

// EncodeCompletion returns Tokenizer.Encode(text, true), as vLLM tokenizes
// completion prompts, reusing the chat prefix cache when the tokenizer's
// special tokens only go in front (Llama's BOS, or none as in Qwen).
func (t *Tokenizers) EncodeCompletion(c *tokenizer.Chat, text string) []uint32 {
	t.mu.Lock()
	sp, ok := t.special[c]
	if !ok {
		sp = probeSpecials(c.Tokenizer())
		t.special[c] = sp
	}
	t.mu.Unlock()
	if !sp.prefixOnly || c.Cache() == nil {
		return c.Tokenizer().Encode(text, true)
	}
	body := c.EncodePrompt(text)
	out := make([]uint32, 0, len(sp.prefix)+len(body))
	return append(append(out, sp.prefix...), body...)
}

// probeSpecials checks, on a few probe texts, that adding special tokens
// equals prepending the tokens the empty text gets.
func probeSpecials(tok *tokenizer.Tokenizer) *completionSpecials {
	sp := &completionSpecials{prefix: tok.Encode("", true), prefixOnly: true}
	for _, probe := range []string{"a", "Hello world.", " two  spaces\n"} {
		want := tok.Encode(probe, true)
		got := append(slices.Clone(sp.prefix), tok.Encode(probe, false)...)
		if !slices.Equal(got, want) {
			sp.prefixOnly = false
		}
	}
	return sp
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
