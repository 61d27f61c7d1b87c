package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// docBytes is the size a document grows to before the next one starts:
// about a prompt's worth of text.
const docBytes = 2048

// turnEnd is each model's end-of-turn token: the chat text joins the
// documents with it, as a conversation's turns are, so kvroute's prefix
// cache has chunks to cut.
var turnEnd = map[string]string{
	"llama3":      "<|eot_id|>",
	"qwen3":       "<|im_end|>",
	"deepseek_v3": "<｜end▁of▁sentence｜>",
}

// corpus is the text every side encodes: the documents (whole and one by
// one) and, per model, the chat text.
type corpus struct {
	Docs []string          `json:"docs"`
	Chat map[string]string `json:"chat"`
}

// whole is the documents joined, byte for byte the source text.
func (c corpus) whole() string { return strings.Join(c.Docs, "") }

// cutDocs cuts text into documents of whole lines, each at least docBytes
// long except perhaps the last; joined they give text back.
func cutDocs(text string) []string {
	var docs []string
	start := 0
	for i := 0; i < len(text); {
		j := strings.IndexByte(text[i:], '\n')
		if j < 0 {
			break
		}
		i += j + 1
		if i-start >= docBytes {
			docs = append(docs, text[start:i])
			start = i
		}
	}
	if start < len(text) {
		docs = append(docs, text[start:])
	}
	return docs
}

// buildCorpus reads the source text and makes the corpus for models.
func buildCorpus(source string, models []string) (corpus, error) {
	data, err := os.ReadFile(source)
	if err != nil {
		return corpus{}, fmt.Errorf("read corpus: %w", err)
	}
	c := corpus{Docs: cutDocs(string(data)), Chat: map[string]string{}}
	for _, m := range models {
		end, ok := turnEnd[m]
		if !ok {
			return corpus{}, fmt.Errorf("no end-of-turn token known for model %q", m)
		}
		c.Chat[m] = strings.Join(c.Docs, end) + end
	}
	return c, nil
}

// writeCorpus writes c to dir/corpus.json, the file the peers read.
func writeCorpus(dir string, c corpus) error {
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "corpus.json"), data, 0o644)
}
