package tokenizer

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
)

// ErrUnknownModel is matched (errors.Is) by the error Registry.Get returns
// for a model it has no tokenizer for. The router then routes by load alone.
var ErrUnknownModel = errors.New("no tokenizer registered for model")

// UnknownModelError names the model that has no tokenizer.
type UnknownModelError struct {
	Model string
}

func (e *UnknownModelError) Error() string { return fmt.Sprintf("%v: %q", ErrUnknownModel, e.Model) }

// Is makes errors.Is(err, ErrUnknownModel) true.
func (e *UnknownModelError) Is(target error) bool { return target == ErrUnknownModel }

// ModelSource says where a model's tokenizer lives.
type ModelSource struct {
	// Dir holds tokenizer.json and tokenizer_config.json.
	Dir string
	// ChatTemplate, when not empty, is a template file that overrides the
	// tokenizer's own (vLLM's --chat-template for that model).
	ChatTemplate string
}

// Registry maps model names — served names and LoRA adapter names — to
// tokenizers. Each tokenizer folder is loaded once, on first use, and shared
// by every name that maps to it. A Registry is safe for concurrent use.
type Registry struct {
	opts ChatOptions

	mu      sync.RWMutex
	byName  map[string]*registryEntry
	bySrcID map[ModelSource]*registryEntry
}

type registryEntry struct {
	src  ModelSource
	once sync.Once
	chat *Chat
	err  error
}

// NewRegistry returns an empty registry whose Chats are built with opts
// (TemplateOverride is ignored: templates come from each ModelSource).
func NewRegistry(opts ChatOptions) *Registry {
	opts.TemplateOverride = ""
	return &Registry{opts: opts, byName: map[string]*registryEntry{}, bySrcID: map[ModelSource]*registryEntry{}}
}

// Add maps name, and each LoRA adapter name in adapters, to src. Nothing is
// loaded yet. Re-adding a name to a different source is an error.
func (r *Registry) Add(name string, src ModelSource, adapters ...string) error {
	if src.Dir == "" {
		return fmt.Errorf("tokenizer registry: model %q has no tokenizer folder", name)
	}
	src.Dir = filepath.Clean(src.Dir)
	if src.ChatTemplate != "" {
		src.ChatTemplate = filepath.Clean(src.ChatTemplate)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.bySrcID[src]
	if !ok {
		e = &registryEntry{src: src}
		r.bySrcID[src] = e
	}
	for _, n := range append([]string{name}, adapters...) {
		if n == "" {
			return errors.New("tokenizer registry: empty model name")
		}
		if old, ok := r.byName[n]; ok && old != e {
			return fmt.Errorf("tokenizer registry: model %q already maps to %s", n, old.src.Dir)
		}
		r.byName[n] = e
	}
	return nil
}

// Get returns the Chat for a model or adapter name, loading its tokenizer on
// first use. Concurrent callers wait for one load. Unknown names return an
// *UnknownModelError; a folder that fails to load returns that error, every
// time (fix the files and restart).
func (r *Registry) Get(name string) (*Chat, error) {
	r.mu.RLock()
	e, ok := r.byName[name]
	r.mu.RUnlock()
	if !ok {
		return nil, &UnknownModelError{Model: name}
	}
	e.once.Do(func() {
		e.chat, e.err = LoadChat(e.src.Dir, e.src.ChatTemplate, r.opts)
		if e.err != nil {
			e.err = fmt.Errorf("tokenizer registry: model %q: %w", name, e.err)
		}
	})
	return e.chat, e.err
}

// Models lists the registered names, sorted.
func (r *Registry) Models() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.byName))
	for n := range r.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
