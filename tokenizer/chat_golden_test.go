package tokenizer

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// chatGolden is one line of testdata/chat/*.jsonl, written by gen/chat.mjs.
type chatGolden struct {
	Case      string          `json:"case"`
	Template  string          `json:"template"`
	Source    string          `json:"template_source"` // set when the case renders a rewritten template
	Tokenizer string          `json:"tokenizer"`
	Request   json.RawMessage `json:"request"`
	Text      *string         `json:"text"`
	IDs       []uint32        `json:"ids"`
	Error     string          `json:"error"`
}

func readChatGoldens(t *testing.T, path string) []chatGolden {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []chatGolden
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var g chatGolden
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, g)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	testTokMu sync.Mutex
	testToks  = map[string]*Tokenizer{}
)

// testTokenizer loads testdata/<name> once per test binary.
func testTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	testTokMu.Lock()
	defer testTokMu.Unlock()
	if tok, ok := testToks[name]; ok {
		return tok
	}
	tok, err := Load(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	testToks[name] = tok
	return tok
}

func realTemplate(t testing.TB, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "chat_templates.json"))
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]string
	if err := json.Unmarshal(data, &all); err != nil {
		t.Fatal(err)
	}
	src, ok := all[key]
	if !ok {
		t.Fatalf("no template %q in chat_templates.json", key)
	}
	return src
}

// testChat builds a Chat for a tokenizer folder in testdata with one of the
// real templates as its override.
func testChat(t testing.TB, tokName, templateKey string, cacheBytes int) *Chat {
	t.Helper()
	return testChatSource(t, tokName, templateKey, "", cacheBytes)
}

// testChatSource is testChat with an explicit template source when source
// is not empty.
func testChatSource(t testing.TB, tokName, templateKey, source string, cacheBytes int) *Chat {
	t.Helper()
	cfg, err := LoadConfig(filepath.Join("testdata", tokName))
	if err != nil {
		t.Fatal(err)
	}
	if source == "" {
		source = realTemplate(t, templateKey)
	}
	c, err := NewChat(testTokenizer(t, tokName), cfg, ChatOptions{TemplateOverride: source, CacheBytes: cacheBytes})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestChatMatchesReferenceRendersAndIDs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "chat", "*.jsonl"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no chat goldens: %v", err)
	}
	for _, file := range files {
		family := strings.TrimSuffix(filepath.Base(file), ".jsonl")
		if family == "probe" {
			continue
		}
		goldens := readChatGoldens(t, file)
		t.Run(family, func(t *testing.T) {
			cached := testChatSource(t, goldens[0].Tokenizer, goldens[0].Template, goldens[0].Source, 0)
			uncached := testChatSource(t, goldens[0].Tokenizer, goldens[0].Template, goldens[0].Source, -1)
			for _, g := range goldens {
				t.Run(g.Case, func(t *testing.T) {
					req, err := ParseChatRequest(g.Request)
					if err != nil {
						t.Fatalf("parse request: %v", err)
					}
					text, err := cached.ApplyChatTemplate(req)
					if g.Error != "" {
						var te *TemplateError
						if !errors.As(err, &te) || te.Message != g.Error {
							t.Fatalf("error = %v, want template error %q", err, g.Error)
						}
						return
					}
					if err != nil {
						t.Fatalf("render: %v", err)
					}
					if text != *g.Text {
						t.Fatalf("rendered text differs from the reference\n got: %q\nwant: %q", text, *g.Text)
					}
					for name, c := range map[string]*Chat{"cached": cached, "uncached": uncached} {
						for round := range 2 { // the second round is served from the cache
							ids, err := c.EncodeChat(req)
							if err != nil {
								t.Fatal(err)
							}
							if !slices.Equal(ids, g.IDs) {
								t.Fatalf("%s round %d: ids differ from the reference\n got: %v\nwant: %v", name, round, ids, g.IDs)
							}
						}
					}
				})
			}
		})
	}
}

// The probe template prints what templates receive; it proves request key
// order, vLLM's message rebuilding and Python's json.dumps spelling.
func TestTemplatesReceiveTheReferenceStructures(t *testing.T) {
	goldens := readChatGoldens(t, filepath.Join("testdata", "chat", "probe.jsonl"))
	tpl, err := ParseTemplate("{{ tools | tojson }}\n{{ messages | tojson(indent=2) }}\n{{ messages[-1]['role'] }}")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range goldens {
		t.Run(g.Case, func(t *testing.T) {
			req, err := ParseChatRequest(g.Request)
			if err != nil {
				t.Fatal(err)
			}
			msgs := make([]any, len(req.Messages))
			for i := range req.Messages {
				msgs[i] = req.Messages[i].templateMessage()
			}
			vars := map[string]any{"messages": msgs}
			if req.Tools != nil {
				vars["tools"] = req.Tools
			}
			got, err := tpl.Render(vars)
			if err != nil {
				t.Fatal(err)
			}
			if got != *g.Text {
				t.Fatalf("probe differs\n got: %s\nwant: %s", got, *g.Text)
			}
		})
	}
}
