package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseConfigReadsTokensAndTemplates(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{
		"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
		"eos_token": "</s>",
		"unk_token": null,
		"pad_token": "",
		"additional_special_tokens": ["<a>", {"content": "<b>"}],
		"add_bos_token": true,
		"tokenizer_class": "LlamaTokenizerFast",
		"chat_template": [
			{"name": "default", "template": "D"},
			{"name": "tool_use", "template": "T"},
			{"name": "rag", "template": "R"}
		]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SpecialTokens["bos_token"] != "<s>" || cfg.SpecialTokens["eos_token"] != "</s>" {
		t.Errorf("special tokens = %v", cfg.SpecialTokens)
	}
	if _, ok := cfg.SpecialTokens["unk_token"]; ok {
		t.Error("null unk_token became a variable")
	}
	if _, ok := cfg.SpecialTokens["pad_token"]; ok {
		t.Error("empty pad_token became a variable (transformers leaves it out)")
	}
	if strings.Join(cfg.AdditionalSpecialTokens, ",") != "<a>,<b>" {
		t.Errorf("additional = %v", cfg.AdditionalSpecialTokens)
	}
	if cfg.AddBOSToken == nil || !*cfg.AddBOSToken || cfg.AddEOSToken != nil {
		t.Errorf("add_bos_token/add_eos_token = %v/%v", cfg.AddBOSToken, cfg.AddEOSToken)
	}
	for _, tc := range []struct {
		tools      bool
		name, want string
	}{{false, "default", "D"}, {true, "tool_use", "T"}} {
		name, src, err := cfg.TemplateFor(tc.tools)
		if err != nil || name != tc.name || src != tc.want {
			t.Errorf("TemplateFor(%v) = %q %q %v, want %q %q", tc.tools, name, src, err, tc.name, tc.want)
		}
	}
}

func TestTemplateSelectionWithoutDefault(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"chat_template": [{"name": "rag", "template": "R"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cfg.TemplateFor(false); !errors.Is(err, ErrNoChatTemplate) || !strings.Contains(err.Error(), "rag") {
		t.Fatalf("err = %v, want ErrNoChatTemplate naming the templates", err)
	}
	empty, err := ParseConfig([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := empty.TemplateFor(true); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("err = %v, want ErrNoChatTemplate", err)
	}
}

func TestParseConfigRejectsMalformedFiles(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not JSON", `{"bos_token": `, "tokenizer config"},
		{"not an object", `[1, 2]`, "not an object"},
		{"token is a number", `{"bos_token": 1}`, "bos_token"},
		{"token object without content", `{"eos_token": {"lstrip": true}}`, "eos_token"},
		{"template is a number", `{"chat_template": 3}`, "chat_template"},
		{"template entry without name", `{"chat_template": [{"template": "x"}]}`, "chat_template"},
		{"add_bos_token is a string", `{"add_bos_token": "yes"}`, "add_bos_token"},
		{"additional tokens not a list", `{"additional_special_tokens": "x"}`, "additional_special_tokens"},
		{"trailing data", `{} {}`, "after the top-level value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfigPrefersChatTemplateJinjaFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"chat_template": "old", "eos_token": "<e>"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "additional_chat_templates"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "additional_chat_templates", "tool_use.jinja"), []byte("tools"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ChatTemplate != "new" || cfg.SpecialTokens["eos_token"] != "<e>" {
		t.Fatalf("cfg = %+v", cfg)
	}
	if name, src, err := cfg.TemplateFor(true); err != nil || name != "tool_use" || src != "tools" {
		t.Fatalf("TemplateFor(tools) = %q %q %v", name, src, err)
	}
	none, err := LoadConfig(t.TempDir())
	if err != nil || none.ChatTemplate != "" {
		t.Fatalf("missing files: %+v, %v", none, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(dir); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Fatalf("err = %v, want one naming the file", err)
	}
}

func TestLoadConfigReadsRealFiles(t *testing.T) {
	for _, tc := range []struct{ dir, bos, eos string }{
		{"llama3", "<|begin_of_text|>", "<|end_of_text|>"},
		{"qwen3", "", "<|im_end|>"},
		{"mistral-sp", "<s>", "</s>"},
		{"deepseek_v3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
	} {
		cfg, err := LoadConfig(filepath.Join("testdata", tc.dir))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.SpecialTokens["bos_token"] != tc.bos || cfg.SpecialTokens["eos_token"] != tc.eos {
			t.Errorf("%s: bos/eos = %q/%q", tc.dir, cfg.SpecialTokens["bos_token"], cfg.SpecialTokens["eos_token"])
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, dir := range []string{"llama3", "qwen3", "mistral-sp", "deepseek_v3"} {
		if data, err := os.ReadFile(filepath.Join("testdata", dir, "tokenizer_config.json")); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"chat_template": [{"name": "default", "template": "x"}], "bos_token": {"content": "<s>"}}`))
	f.Add([]byte(`{"additional_special_tokens": [null, 1]}`))
	f.Add([]byte(`[[[[[[[[[[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err == nil && cfg.SpecialTokens == nil {
			t.Fatal("nil special tokens on success")
		}
	})
}
