package picker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

func TestNewTokenizerRegistryReadsTheFlags(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "plain.jinja")
	if err := os.WriteFile(tmpl, []byte("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		specs     []string
		templates []string
		wantErr   string
	}{
		{name: "model and folder", specs: []string{"m=" + qwenDir}},
		{name: "two names share one folder", specs: []string{"a=" + qwenDir, "b=" + qwenDir}},
		{name: "template override", specs: []string{"m=" + qwenDir}, templates: []string{"m=" + tmpl}},
		{name: "bare folder is tokenize's form", specs: []string{qwenDir}, wantErr: "MODEL=DIR"},
		{name: "empty model", specs: []string{"=" + qwenDir}, wantErr: "MODEL=DIR"},
		{name: "template without a tokenizer", specs: []string{"m=" + qwenDir}, templates: []string{"x=" + tmpl}, wantErr: `"x"`},
		{name: "template without a file", specs: []string{"m=" + qwenDir}, templates: []string{"m"}, wantErr: "MODEL=FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg, err := NewTokenizerRegistry(tt.specs, tt.templates, tokenizer.ChatOptions{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := len(reg.Models()); got != len(tt.specs) {
				t.Fatalf("%d models registered, want %d", got, len(tt.specs))
			}
		})
	}
}

func TestChatTemplateOverrideChangesThePrompt(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "plain.jinja")
	if err := os.WriteFile(tmpl, []byte("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := NewTokenizerRegistry([]string{"own=" + qwenDir, "plain=" + qwenDir}, []string{"plain=" + tmpl}, tokenizer.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Preload(reg); err != nil {
		t.Fatal(err)
	}
	req, err := tokenizer.ParseChatRequest([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	prompts := map[string]string{}
	for _, m := range []string{"own", "plain"} {
		c, err := lookupChat(reg, m)
		if err != nil || c == nil {
			t.Fatalf("lookup %s: %v %v", m, c, err)
		}
		if prompts[m], err = c.ApplyChatTemplate(req); err != nil {
			t.Fatal(err)
		}
	}
	if prompts["plain"] != "<user>hi\n" {
		t.Errorf("override rendered %q, want %q", prompts["plain"], "<user>hi\n")
	}
	if !strings.Contains(prompts["own"], "<|im_start|>user") {
		t.Errorf("Qwen3's own template rendered %q", prompts["own"])
	}
}

func TestLookupChat(t *testing.T) {
	reg, err := NewTokenizerRegistry([]string{"base=" + qwenDir, "broken=/nonexistent"}, nil, tokenizer.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := lookupChat(reg, "adapter", "base"); c == nil || err != nil {
		t.Errorf("adapter name did not fall back to its base model: %v %v", c, err)
	}
	if c, err := lookupChat(reg, "unknown", ""); c != nil || err != nil {
		t.Errorf("unknown model: %v %v, want neither", c, err)
	}
	if _, err := lookupChat(reg, "broken"); err == nil {
		t.Error("a folder that fails to load was not reported")
	}
	if err := Preload(reg); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("Preload = %v, want the broken folder named", err)
	}
	if c, err := lookupChat(nil, "base"); c != nil || err != nil {
		t.Errorf("nil registry: %v %v", c, err)
	}
}
