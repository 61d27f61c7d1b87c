package picker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

func TestChatTemplateOverrideChangesThePrompt(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "plain.jinja")
	if err := os.WriteFile(tmpl, []byte("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := NewTokenizerRegistry(map[string]tokenizer.ModelSource{"own": {Dir: qwenDir}, "plain": {Dir: qwenDir, ChatTemplate: tmpl}}, tokenizer.ChatOptions{})
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
	reg, err := NewTokenizerRegistry(map[string]tokenizer.ModelSource{"base": {Dir: qwenDir}, "broken": {Dir: "/nonexistent"}}, tokenizer.ChatOptions{})
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
