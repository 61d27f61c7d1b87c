package tokenizer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// Chat joins a Tokenizer with its tokenizer_config.json to turn chat requests
// into prompts and token ids exactly as vLLM does: render the chat template,
// then encode the text without adding special tokens. A Chat is safe for
// concurrent use.
type Chat struct {
	tok   *Tokenizer
	cfg   *Config
	vars  map[string]any // special-token variables, read-only after NewChat
	cache *PrefixCache   // nil disables prefix reuse

	override *Template // per-model template that replaces the tokenizer's own
	tools    ToolsShape
	content  ContentFormat
	defaults Object // DefaultKwargs

	mu        sync.Mutex
	templates map[string]*compiledTemplate // by source selection name
}

type compiledTemplate struct {
	tpl *Template
	err error
}

// ChatOptions tunes NewChat. The zero value uses the tokenizer's own template
// and a default-sized prefix cache.
type ChatOptions struct {
	// TemplateOverride, when not empty, is a chat template source used instead
	// of the tokenizer's (vLLM's --chat-template).
	TemplateOverride string
	// CacheBytes bounds the prefix cache (token ids held, 4 bytes each);
	// 0 means DefaultCacheBytes, negative disables the cache.
	CacheBytes int
	// Tools says how request tools reach the template; the zero value passes
	// them exactly as sent.
	Tools ToolsShape
	// Content says how message content reaches the template; the zero value
	// decides per template as vLLM's "auto" does.
	Content ContentFormat
	// DefaultKwargs are template variables every request gets unless its
	// chat_template_kwargs sets them (vLLM's --default-chat-template-kwargs).
	DefaultKwargs Object
}

// ToolsShape says how tool definitions are handed to chat templates, which
// matters for templates that print them with tojson.
type ToolsShape int

const (
	// ToolsAsSent passes each tool object as the request wrote it, in its key
	// order.
	ToolsAsSent ToolsShape = iota
	// ToolsAsVLLM passes what vLLM's tool.model_dump() produces: "type"
	// (default "function") then "function" as {name, description, parameters,
	// strict} with null for absent fields, each followed by any extra keys in
	// request order. This is how recent vLLM releases render tools.
	ToolsAsVLLM
)

// DefaultCacheBytes is the prefix cache bound when ChatOptions leaves it 0.
const DefaultCacheBytes = 64 << 20

// NewChat builds a Chat. An override template that does not parse is an
// error here; the tokenizer's own template is compiled on first use, and a
// parse failure then is returned by every render.
func NewChat(tok *Tokenizer, cfg *Config, opts ChatOptions) (*Chat, error) {
	if tok == nil {
		return nil, errors.New("chat: nil tokenizer")
	}
	if cfg == nil {
		cfg = &Config{SpecialTokens: map[string]string{}}
	}
	c := &Chat{tok: tok, cfg: cfg, vars: cfg.templateVars(), templates: map[string]*compiledTemplate{},
		tools: opts.Tools, content: opts.Content, defaults: opts.DefaultKwargs}
	for _, f := range opts.DefaultKwargs {
		if reservedKwargs[f.Key] {
			return nil, fmt.Errorf("chat: default template kwargs may not set %q", f.Key)
		}
	}
	if opts.TemplateOverride != "" {
		t, err := ParseTemplate(opts.TemplateOverride)
		if err != nil {
			return nil, fmt.Errorf("chat: template override: %w", err)
		}
		c.override = t
	}
	switch {
	case opts.CacheBytes == 0:
		c.cache = NewPrefixCache(tok, DefaultCacheBytes)
	case opts.CacheBytes > 0:
		c.cache = NewPrefixCache(tok, opts.CacheBytes)
	}
	return c, nil
}

// LoadChat loads the tokenizer and tokenizer_config.json in dir. templateFile,
// when not empty, names a chat template file that overrides the tokenizer's.
func LoadChat(dir, templateFile string, opts ChatOptions) (*Chat, error) {
	tok, err := Load(dir)
	if err != nil {
		return nil, err
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if templateFile != "" {
		src, err := os.ReadFile(templateFile)
		if err != nil {
			return nil, fmt.Errorf("chat: template override: %w", err)
		}
		opts.TemplateOverride = string(src)
	}
	return NewChat(tok, cfg, opts)
}

// Tokenizer returns the underlying tokenizer.
func (c *Chat) Tokenizer() *Tokenizer { return c.tok }

// Config returns the parsed tokenizer_config.json.
func (c *Chat) Config() *Config { return c.cfg }

// Cache returns the prefix cache, or nil when it is disabled.
func (c *Chat) Cache() *PrefixCache { return c.cache }

// template picks and compiles (once) the template for a request.
func (c *Chat) template(hasTools bool) (*Template, error) {
	if c.override != nil {
		return c.override, nil
	}
	name, src, err := c.cfg.TemplateFor(hasTools)
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ct, ok := c.templates[name]
	if !ok {
		ct = &compiledTemplate{}
		ct.tpl, ct.err = ParseTemplate(src)
		if ct.err != nil {
			ct.err = fmt.Errorf("chat: %s template: %w", name, ct.err)
		}
		c.templates[name] = ct
	}
	return ct.tpl, ct.err
}

// CheckTemplate compiles the template a request without tools would use and
// reports whether it parses, so that loaders can fail early.
func (c *Chat) CheckTemplate() error {
	_, err := c.template(false)
	return err
}

// reservedKwargs may not be set through chat_template_kwargs: transformers
// passes them itself and rejects duplicates.
var reservedKwargs = map[string]bool{"messages": true, "chat_template": true, "tokenize": true, "conversation": true}

// ApplyChatTemplate renders req into the prompt text the model server would
// build. A template's raise_exception comes back as a *TemplateError.
func (c *Chat) ApplyChatTemplate(req ChatRequest) (string, error) {
	return c.apply(req, nil, nil)
}

// apply renders req. With scratch nil the text is a new string; otherwise it
// is rendered into scratch and the text shares scratch's memory, so it is
// valid only until scratch is reset.
//
// guard, when not nil (and scratch is), bounds the render: it stops the
// template as soon as the output passes guard.max bytes or guard.done
// reports an error, and apply returns that error.
func (c *Chat) apply(req ChatRequest, scratch *bytes.Buffer, guard *renderGuard) (string, error) {
	tools := req.Tools
	if v, ok := req.ChatTemplateKwargs.Get("tools"); ok {
		tl, _ := v.([]any)
		tools = tl
	}
	tpl, err := c.template(len(tools) > 0)
	if err != nil {
		return "", err
	}
	vars := make(map[string]any, len(c.vars)+4+len(req.ChatTemplateKwargs))
	for k, v := range c.vars {
		vars[k] = v
	}
	parts := c.content == ContentParts || (c.content == ContentAuto && tpl.loopsOverContent)
	msgs := make([]any, len(req.Messages))
	for i := range req.Messages {
		if !parts && len(req.Messages[i].Images) > 0 {
			return "", errors.New("chat: image parts need a template that loops over message content")
		}
		msgs[i] = req.Messages[i].templateMessageAs(parts)
	}
	vars["messages"] = msgs
	if req.Tools != nil {
		if c.tools == ToolsAsVLLM {
			vars["tools"] = vllmToolDump(req.Tools)
		} else {
			vars["tools"] = req.Tools
		}
	}
	addGen := req.generationPrompt()
	if req.ContinueFinalMessage && addGen {
		// transformers refuses the pair, and vLLM's add_generation_prompt
		// defaults to true: a prefill request must send it as false.
		return "", errors.New("chat: continue_final_message needs add_generation_prompt set to false")
	}
	vars["add_generation_prompt"] = addGen
	for _, f := range c.defaults {
		vars[f.Key] = f.Value
	}
	for _, f := range req.ChatTemplateKwargs {
		if reservedKwargs[f.Key] {
			return "", fmt.Errorf("chat: chat_template_kwargs may not set %q", f.Key)
		}
		vars[f.Key] = f.Value
	}
	var text string
	if scratch == nil {
		text, err = tpl.Render(vars)
	} else if guard != nil {
		guard.Buffer = scratch
		if err = tpl.renderTo(guard, vars); guard.err != nil {
			err = guard.err
		}
		if err == nil {
			text = unsafe.String(unsafe.SliceData(scratch.Bytes()), scratch.Len())
		}
	} else if err = tpl.renderTo(scratch, vars); err == nil {
		text = unsafe.String(unsafe.SliceData(scratch.Bytes()), scratch.Len())
	}
	if err != nil || !req.ContinueFinalMessage {
		return text, err
	}
	return cutAfterFinalMessage(text, req.Messages, parts)
}

// cutAfterFinalMessage ends the rendered text where the last message's
// content ends, as transformers does for continue_final_message: it finds the
// last occurrence of the stripped content and keeps the content's own
// leading spacing when the template preserved it.
func cutAfterFinalMessage(text string, msgs []Message, parts bool) (string, error) {
	if len(msgs) == 0 {
		return "", errors.New("chat: continue_final_message needs a final message")
	}
	last := msgs[len(msgs)-1]
	final := last.Content
	if parts && last.Role != "tool" && len(last.Parts) > 0 {
		final = last.Parts[len(last.Parts)-1] // transformers continues the last text part
	}
	stripped := strings.TrimFunc(final, pyWhitespace)
	loc := strings.LastIndex(text, stripped)
	if loc < 0 {
		return "", errors.New("chat: continue_final_message is set but the final message does not appear in the rendered chat")
	}
	left := strings.TrimLeftFunc(final, pyWhitespace)
	if end := loc + len(left); end <= len(text) && text[loc:end] == final {
		return text[:end], nil
	}
	return text[:loc+len(stripped)], nil
}

// EncodeChat renders req and encodes the text without adding special tokens,
// reusing cached ids of earlier turns where the prefix cache allows.
func (c *Chat) EncodeChat(req ChatRequest) ([]uint32, error) {
	return c.AppendEncodeChat(nil, req)
}

// AppendEncodeChat is EncodeChat appending the ids to dst, for callers that
// reuse one buffer across requests. On error it returns dst unchanged.
func (c *Chat) AppendEncodeChat(dst []uint32, req ChatRequest) ([]uint32, error) {
	// The prompt text only lives until it is encoded, so it is rendered into
	// a pooled buffer: for a long chat it is the size of the whole
	// conversation, allocated on every routing decision otherwise. Encoding
	// keeps nothing that points into the text (the piece cache clones its
	// keys, the prefix cache keeps hashes), so the buffer can be reused.
	buf := renderBuffers.Get().(*bytes.Buffer)
	defer putRenderBuffer(buf)
	text, err := c.apply(req, buf, nil)
	if err != nil {
		return dst, err
	}
	return c.AppendEncodePrompt(dst, text), nil
}

// ErrPromptTooLarge is returned by AppendEncodeChatContext for a rendered
// prompt over its byte limit.
var ErrPromptTooLarge = errors.New("chat: rendered prompt exceeds the byte limit")

// AppendEncodeChatContext is AppendEncodeChat bounded for input from the
// network: it stops with ctx's error when ctx ends (checked after
// rendering and between the prompt's chunks, one per message, not per
// token), and refuses a rendered prompt over maxBytes (0: no limit) with
// ErrPromptTooLarge before encoding it.
func (c *Chat) AppendEncodeChatContext(ctx context.Context, dst []uint32, req ChatRequest, maxBytes int) ([]uint32, error) {
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	buf := renderBuffers.Get().(*bytes.Buffer)
	defer putRenderBuffer(buf)
	text, err := c.apply(req, buf, &renderGuard{done: ctx.Err, max: maxBytes})
	if err != nil {
		return dst, err
	}
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	if c.cache == nil {
		return appendIDs(dst, c.tok.Encode(text, false)), nil
	}
	n := len(dst)
	out, err := c.cache.appendEncode(ctx.Err, dst, text)
	if err != nil {
		return out[:n], err
	}
	return out, nil
}

// renderGuard is the render's output buffer, bounded: a write that would
// pass max bytes, or that finds done failing (checked every few writes;
// templates write a message in a handful of pieces), fails, which ends
// the template's execution there.
type renderGuard struct {
	*bytes.Buffer
	done   func() error
	max    int
	writes int
	err    error
}

func (g *renderGuard) Write(p []byte) (int, error) {
	if err := g.check(len(p)); err != nil {
		return 0, err
	}
	return g.Buffer.Write(p)
}

// WriteString shadows bytes.Buffer's, which a writer may be asked for
// directly (io.StringWriter), so every write is checked.
func (g *renderGuard) WriteString(s string) (int, error) {
	if err := g.check(len(s)); err != nil {
		return 0, err
	}
	return g.Buffer.WriteString(s)
}

// WriteByte and WriteRune shadow bytes.Buffer's for the same reason.
func (g *renderGuard) WriteByte(c byte) error {
	if err := g.check(1); err != nil {
		return err
	}
	return g.Buffer.WriteByte(c)
}

func (g *renderGuard) WriteRune(r rune) (int, error) {
	if err := g.check(utf8.RuneLen(r)); err != nil {
		return 0, err
	}
	return g.Buffer.WriteRune(r)
}

func (g *renderGuard) check(n int) error {
	if g.err != nil {
		return g.err
	}
	if g.max > 0 && g.Len()+n > g.max {
		g.err = fmt.Errorf("%w: over %d bytes", ErrPromptTooLarge, g.max)
		return g.err
	}
	if g.writes++; g.writes%32 == 0 && g.done != nil {
		if err := g.done(); err != nil {
			g.err = err
			return err
		}
	}
	return nil
}

var renderBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledRender bounds the buffers kept for reuse, so that one huge
// conversation does not stay pinned in the pool.
const maxPooledRender = 4 << 20

func putRenderBuffer(b *bytes.Buffer) {
	if b.Cap() > maxPooledRender {
		return
	}
	b.Reset()
	renderBuffers.Put(b)
}

// EncodePrompt encodes rendered chat text without adding special tokens,
// through the prefix cache when it is enabled.
func (c *Chat) EncodePrompt(text string) []uint32 {
	return c.AppendEncodePrompt(nil, text)
}

// AppendEncodePrompt is EncodePrompt appending the ids to dst.
func (c *Chat) AppendEncodePrompt(dst []uint32, text string) []uint32 {
	if c.cache == nil {
		return appendIDs(dst, c.tok.Encode(text, false))
	}
	return c.cache.AppendEncode(dst, text)
}

// ContentFormat is vLLM's --chat-template-content-format.
type ContentFormat int

const (
	// ContentAuto passes content as parts to templates that loop over it
	// and as a string to the others.
	ContentAuto ContentFormat = iota
	// ContentString always passes content as one string (text parts joined
	// with "\n").
	ContentString
	// ContentParts always passes content as a list of
	// {"type": "text", "text": ...} parts (tool results stay strings).
	ContentParts
)

// vllmToolDump reshapes tools as pydantic's model_dump of vLLM's
// ChatCompletionToolsParam: declared fields first, in declaration order, with
// null for absent ones, then extra keys as sent.
func vllmToolDump(tools []any) []any {
	out := make([]any, len(tools))
	for i, t := range tools {
		obj, ok := t.(Object)
		if !ok {
			out[i] = t
			continue
		}
		typ, ok := obj.Get("type")
		if !ok {
			typ = "function"
		}
		dumped := Object{{"type", typ}}
		if fn, ok := obj.Get("function"); ok {
			if fo, ok := fn.(Object); ok {
				fn = dumpDeclared(fo, "name", "description", "parameters", "strict")
			}
			dumped = append(dumped, Field{"function", fn})
		}
		out[i] = append(dumped, extraFields(obj, "type", "function")...)
	}
	return out
}

func dumpDeclared(o Object, declared ...string) Object {
	out := make(Object, 0, len(o)+len(declared))
	for _, k := range declared {
		v, _ := o.Get(k)
		out = append(out, Field{k, v})
	}
	return append(out, extraFields(o, declared...)...)
}

func extraFields(o Object, declared ...string) Object {
	var out Object
	for _, f := range o {
		if !slices.Contains(declared, f.Key) {
			out = append(out, f)
		}
	}
	return out
}
