package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestRegistryLoadsEachFolderOnceForAllNames(t *testing.T) {
	r := NewRegistry(ChatOptions{})
	dir := filepath.Join("testdata", "mistral-sp")
	if err := r.Add("mistralai/Mistral-7B-Instruct-v0.2", ModelSource{Dir: dir}, "sql-lora", "chat-lora"); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("mistral-alias", ModelSource{Dir: dir + "/"}); err != nil {
		t.Fatal(err)
	}
	names := []string{"mistralai/Mistral-7B-Instruct-v0.2", "sql-lora", "chat-lora", "mistral-alias"}
	chats := make([]*Chat, 32)
	var wg sync.WaitGroup
	for i := range chats {
		wg.Go(func() {
			c, err := r.Get(names[i%len(names)])
			if err != nil {
				t.Error(err)
				return
			}
			chats[i] = c
		})
	}
	wg.Wait()
	for i, c := range chats {
		if c == nil || c != chats[0] {
			t.Fatalf("Get #%d returned a different Chat: the folder was loaded more than once", i)
		}
	}
	if got := chats[0].Tokenizer().Encode("Hello", false); len(got) == 0 {
		t.Fatal("loaded tokenizer encodes nothing")
	}
	if got := r.Models(); len(got) != 4 || got[0] != "chat-lora" {
		t.Fatalf("Models() = %v", got)
	}
}

func TestRegistryUnknownModelIsTyped(t *testing.T) {
	r := NewRegistry(ChatOptions{})
	_, err := r.Get("gpt-4")
	var ume *UnknownModelError
	if !errors.Is(err, ErrUnknownModel) || !errors.As(err, &ume) || ume.Model != "gpt-4" {
		t.Fatalf("err = %v, want an *UnknownModelError for gpt-4", err)
	}
}

func TestRegistryReportsBrokenFoldersAndConflicts(t *testing.T) {
	r := NewRegistry(ChatOptions{})
	missing := filepath.Join(t.TempDir(), "nope")
	if err := r.Add("broken", ModelSource{Dir: missing}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.Get("broken"); err == nil || !strings.Contains(err.Error(), "broken") {
			t.Fatalf("err = %v, want a load error naming the model", err)
		}
	}
	if err := r.Add("broken", ModelSource{Dir: filepath.Join("testdata", "qwen3")}); err == nil {
		t.Fatal("re-adding a name to another folder succeeded")
	}
	if err := r.Add("x", ModelSource{}); err == nil {
		t.Fatal("a source without a folder was accepted")
	}
}

func TestRegistryAppliesPerModelTemplateOverride(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tmpl.jinja")
	if err := os.WriteFile(file, []byte("{% for m in messages %}<<{{ m.role }}:{{ m.content }}>>{% endfor %}"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(ChatOptions{})
	dir := filepath.Join("testdata", "mistral-sp")
	if err := r.Add("plain", ModelSource{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("custom", ModelSource{Dir: dir, ChatTemplate: file}); err != nil {
		t.Fatal(err)
	}
	c, err := r.Get("custom")
	if err != nil {
		t.Fatal(err)
	}
	text, err := c.ApplyChatTemplate(ChatRequest{Messages: []Message{{Role: "user", Content: "hi"}}})
	if err != nil || text != "<<user:hi>>" {
		t.Fatalf("text = %q, %v", text, err)
	}
	// The Mistral-style folder ships no chat template of its own.
	plain, err := r.Get("plain")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.ApplyChatTemplate(ChatRequest{Messages: []Message{{Role: "user", Content: "hi"}}}); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("err = %v, want ErrNoChatTemplate", err)
	}
}
