package tokenizer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Config is what kvroute needs from a Hugging Face tokenizer_config.json: the
// special tokens that templates see as variables and the chat templates.
type Config struct {
	// SpecialTokens maps bos_token, eos_token, unk_token, pad_token,
	// sep_token, cls_token and mask_token to their text; absent or null
	// tokens are left out, as transformers' special_tokens_map does.
	SpecialTokens map[string]string
	// AdditionalSpecialTokens is additional_special_tokens, in file order.
	AdditionalSpecialTokens []string
	// AddBOSToken and AddEOSToken are add_bos_token / add_eos_token; nil when absent.
	AddBOSToken, AddEOSToken *bool
	// ChatTemplate is the default chat template ("" when the file has none).
	ChatTemplate string
	// NamedTemplates holds every template of the list form of chat_template
	// by name (including "default" and "tool_use" when present).
	NamedTemplates map[string]string
	// TokenizerClass is tokenizer_class, for diagnostics.
	TokenizerClass string
}

// specialTokenKeys are the single-token attributes transformers exposes.
var specialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// LoadConfig reads dir/tokenizer_config.json. A missing file yields an empty
// Config (some tokenizers ship none). The newer Hugging Face layout is read
// too: chat_template.jinja beside it supplies the default template, and
// additional_chat_templates/NAME.jinja the named ones (e.g. tool_use).
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(path)
	var cfg *Config
	switch {
	case errors.Is(err, fs.ErrNotExist):
		cfg = &Config{SpecialTokens: map[string]string{}}
	case err != nil:
		return nil, fmt.Errorf("tokenizer config: %w", err)
	default:
		if cfg, err = ParseConfig(data); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	jinja, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	switch {
	case err == nil:
		cfg.ChatTemplate = string(jinja)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("tokenizer config: %w", err)
	}
	extra, err := filepath.Glob(filepath.Join(dir, "additional_chat_templates", "*.jinja"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer config: %w", err)
	}
	for _, path := range extra {
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("tokenizer config: %w", err)
		}
		if cfg.NamedTemplates == nil {
			cfg.NamedTemplates = map[string]string{}
		}
		cfg.NamedTemplates[strings.TrimSuffix(filepath.Base(path), ".jinja")] = string(src)
	}
	return cfg, nil
}

// ParseConfig decodes the contents of a tokenizer_config.json.
func ParseConfig(data []byte) (*Config, error) {
	v, err := DecodeJSON(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer config: %w", err)
	}
	top, ok := v.(Object)
	if !ok {
		return nil, fmt.Errorf("tokenizer config: top level is a JSON %s, not an object", jsonKind(v))
	}
	cfg := &Config{SpecialTokens: map[string]string{}}
	for _, key := range specialTokenKeys {
		raw, _ := top.Get(key)
		tok, err := tokenContent(raw)
		if err != nil {
			return nil, fmt.Errorf("tokenizer config: %s: %w", key, err)
		}
		if tok != "" {
			cfg.SpecialTokens[key] = tok
		}
	}
	if raw, ok := top.Get("additional_special_tokens"); ok && raw != nil {
		list, ok := raw.([]any)
		if !ok {
			return nil, fmt.Errorf("tokenizer config: additional_special_tokens is a JSON %s, not an array", jsonKind(raw))
		}
		for i, item := range list {
			tok, err := tokenContent(item)
			if err != nil {
				return nil, fmt.Errorf("tokenizer config: additional_special_tokens[%d]: %w", i, err)
			}
			cfg.AdditionalSpecialTokens = append(cfg.AdditionalSpecialTokens, tok)
		}
	}
	for key, dst := range map[string]**bool{"add_bos_token": &cfg.AddBOSToken, "add_eos_token": &cfg.AddEOSToken} {
		if raw, ok := top.Get(key); ok && raw != nil {
			b, ok := raw.(bool)
			if !ok {
				return nil, fmt.Errorf("tokenizer config: %s is a JSON %s, not a boolean", key, jsonKind(raw))
			}
			*dst = &b
		}
	}
	if raw, ok := top.Get("tokenizer_class"); ok && raw != nil {
		s, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("tokenizer config: tokenizer_class is a JSON %s, not a string", jsonKind(raw))
		}
		cfg.TokenizerClass = s
	}
	if raw, ok := top.Get("chat_template"); ok && raw != nil {
		if err := cfg.setChatTemplate(raw); err != nil {
			return nil, fmt.Errorf("tokenizer config: chat_template: %w", err)
		}
	}
	return cfg, nil
}

// tokenContent accepts a token as a string or as an AddedToken object
// ({"content": "...", ...}); null means no token.
func tokenContent(raw any) (string, error) {
	switch t := raw.(type) {
	case nil:
		return "", nil
	case string:
		return t, nil
	case Object:
		c, _ := t.Get("content")
		s, ok := c.(string)
		if !ok {
			return "", fmt.Errorf("token object's content is a JSON %s, not a string", jsonKind(c))
		}
		return s, nil
	}
	return "", fmt.Errorf("token is a JSON %s, not a string or an object", jsonKind(raw))
}

// setChatTemplate accepts a string or a list of {"name", "template"} objects.
func (c *Config) setChatTemplate(raw any) error {
	switch t := raw.(type) {
	case string:
		c.ChatTemplate = t
		return nil
	case []any:
		c.NamedTemplates = make(map[string]string, len(t))
		for i, item := range t {
			obj, ok := item.(Object)
			if !ok {
				return fmt.Errorf("entry %d is a JSON %s, not an object", i, jsonKind(item))
			}
			name, _ := obj.Get("name")
			src, _ := obj.Get("template")
			ns, ok1 := name.(string)
			ts, ok2 := src.(string)
			if !ok1 || !ok2 {
				return fmt.Errorf("entry %d needs string name and template", i)
			}
			c.NamedTemplates[ns] = ts
		}
		c.ChatTemplate = c.NamedTemplates["default"]
		return nil
	}
	return fmt.Errorf("a JSON %s, not a string or a list of named templates", jsonKind(raw))
}

// TemplateFor picks the template source as transformers does: the
// "tool_use" template when the request has tools and the tokenizer has one,
// otherwise the default.
func (c *Config) TemplateFor(hasTools bool) (name, source string, err error) {
	if hasTools {
		if s, ok := c.NamedTemplates["tool_use"]; ok {
			return "tool_use", s, nil
		}
	}
	if c.ChatTemplate != "" {
		return "default", c.ChatTemplate, nil
	}
	if len(c.NamedTemplates) > 0 {
		names := make([]string, 0, len(c.NamedTemplates))
		for n := range c.NamedTemplates {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", "", fmt.Errorf("%w: named templates %v have no \"default\"", ErrNoChatTemplate, names)
	}
	return "", "", ErrNoChatTemplate
}

// ErrNoChatTemplate means the tokenizer has no chat template and none was
// given as an override.
var ErrNoChatTemplate = errors.New("tokenizer has no chat template")

// templateVars are the variables every render of this tokenizer's templates
// starts from: the special tokens.
func (c *Config) templateVars() map[string]any {
	vars := make(map[string]any, len(c.SpecialTokens)+1)
	for k, v := range c.SpecialTokens {
		vars[k] = v
	}
	if len(c.AdditionalSpecialTokens) > 0 {
		vars["additional_special_tokens"] = append([]string(nil), c.AdditionalSpecialTokens...)
	}
	return vars
}
