package picker

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/kvroute/kvroute/tokenizer"
)

// NewTokenizerRegistry builds a registry with one entry per model: its
// tokenizer folder and optional chat template override. Nothing is loaded
// yet; call Preload to fail fast on bad folders.
func NewTokenizerRegistry(models map[string]tokenizer.ModelSource, opts tokenizer.ChatOptions) (*tokenizer.Registry, error) {
	reg := tokenizer.NewRegistry(opts)
	for _, model := range slices.Sorted(maps.Keys(models)) {
		if err := reg.Add(model, models[model]); err != nil {
			return nil, fmt.Errorf("tokenizer for %s: %w", model, err)
		}
	}
	return reg, nil
}

// Preload loads every registered tokenizer now, so that a bad folder or
// template stops the router at start instead of routing by load later.
func Preload(reg *tokenizer.Registry) error {
	var errs []error
	for _, m := range reg.Models() {
		if _, err := reg.Get(m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// lookupChat returns the chat tokenizer for a request's model, trying each
// name in order (an adapter name, then its base model). A folder that fails
// to load is reported as an error; unknown names are not.
func lookupChat(reg *tokenizer.Registry, models ...string) (*tokenizer.Chat, error) {
	if reg == nil {
		return nil, nil
	}
	for _, m := range models {
		if m == "" {
			continue
		}
		c, err := reg.Get(m)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, tokenizer.ErrUnknownModel) {
			return nil, err
		}
	}
	return nil, nil
}

// completionEncoder tokenizes /v1/completions prompts as vLLM does
// (Encode(text, true)), reusing the chat prefix cache when a tokenizer's
// special tokens only go in front (Llama's BOS, or none as in Qwen).
type completionEncoder struct {
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

// appendEncode appends c.Tokenizer().Encode(text, true) to dst.
func (e *completionEncoder) appendEncode(dst []uint32, c *tokenizer.Chat, text string) []uint32 {
	e.mu.Lock()
	if e.special == nil {
		e.special = map[*tokenizer.Chat]*completionSpecials{}
	}
	sp, ok := e.special[c]
	if !ok {
		sp = probeSpecials(c.Tokenizer())
		e.special[c] = sp
	}
	e.mu.Unlock()
	if !sp.prefixOnly || c.Cache() == nil {
		return append(dst, c.Tokenizer().Encode(text, true)...)
	}
	return c.AppendEncodePrompt(append(dst, sp.prefix...), text)
}

// tokenBuffers holds the prompt id buffers of decisions in progress: the
// ids only live until the prompt's block hashes are computed, and an 8k
// chat's ids would otherwise be a fresh 32 KB per decision.
var tokenBuffers = sync.Pool{New: func() any { return new([]uint32) }}

// maxPooledTokens bounds the buffers kept, so one 100k-token prompt does
// not pin its buffer for good.
const maxPooledTokens = 1 << 16

func getTokenBuffer() *[]uint32 { return tokenBuffers.Get().(*[]uint32) }

func putTokenBuffer(b *[]uint32) {
	if cap(*b) > maxPooledTokens {
		return
	}
	*b = (*b)[:0]
	tokenBuffers.Put(b)
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
