package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const tokTestdata = "../../tokenizer/testdata"

// mistralTemplateFile writes the real Mistral template to a file, as an
// operator would pass it with --chat-template.
func mistralTemplateFile(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tokTestdata, "chat_templates.json"))
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]string
	if err := json.Unmarshal(data, &all); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "mistral.jinja")
	if err := os.WriteFile(file, []byte(all["library/mistral:7b-instruct-fp16"]), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func runLines(t *testing.T, args []string, input string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := runTokenize(context.Background(), args, strings.NewReader(input), &out, &errOut, os.LookupEnv); err != nil {
		t.Fatalf("runTokenize: %v (stderr %q)", err, errOut.String())
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}

func TestTokenizeAnswersEveryLineInOrder(t *testing.T) {
	args := []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp"), "--chat-template", mistralTemplateFile(t)}
	cases := []struct {
		name, in, want string
	}{
		{"text without special tokens", `{"text": "Hello world", "add_special_tokens": false}`, `{"ids":[22557,1526]}`},
		{"text with special tokens by default", `{"text": "Hello world"}`, `{"ids":[1,22557,1526]}`},
		{"empty text", `{"text": "", "add_special_tokens": false}`, `{"ids":[]}`},
		{"chat body", `{"model": "m", "messages": [{"role": "user", "content": "Hello there"}]}`,
			`{"text":"<s>[INST] Hello there [/INST]","ids":[1,733,16289,28793,22557,736,733,28748,16289,28793]}`},
		{"template error", `{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}`,
			`{"error":"chat template: Conversation roles must alternate user/assistant/user/assistant/..."}`},
		{"not JSON", `{"text": `, `{"error":"invalid JSON: unexpected end of JSON input"}`},
		{"empty line", ``, `{"error":"empty line: want a JSON object"}`},
		{"neither shape", `{"prompt": "x"}`, `{"error":"want {\"text\": ...} or an OpenAI chat body with \"messages\""}`},
		{"bad messages", `{"messages": "hi"}`, `{"error":"chat request: messages is a JSON string, not an array"}`},
	}
	var in strings.Builder
	for _, c := range cases {
		in.WriteString(c.in + "\n")
	}
	got := runLines(t, args, in.String())
	if len(got) != len(cases) {
		t.Fatalf("got %d output lines for %d input lines:\n%s", len(got), len(cases), strings.Join(got, "\n"))
	}
	for i, c := range cases {
		if got[i] != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got[i], c.want)
		}
	}
}

// The chat output must match the reference goldens of the tokenizer package.
func TestTokenizeChatMatchesReferenceGoldens(t *testing.T) {
	f, err := os.Open(filepath.Join(tokTestdata, "chat", "mistral.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type golden struct {
		Request json.RawMessage `json:"request"`
		Text    *string         `json:"text"`
		IDs     []uint32        `json:"ids"`
		Error   string          `json:"error"`
	}
	var goldens []golden
	var in strings.Builder
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		var g golden
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatal(err)
		}
		goldens = append(goldens, g)
		in.Write(g.Request)
		in.WriteByte('\n')
	}
	args := []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp"), "--chat-template", mistralTemplateFile(t)}
	lines := runLines(t, args, in.String())
	if len(lines) != len(goldens) {
		t.Fatalf("got %d lines, want %d", len(lines), len(goldens))
	}
	for i, g := range goldens {
		var res struct {
			Text  *string  `json:"text"`
			IDs   []uint32 `json:"ids"`
			Error string   `json:"error"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &res); err != nil {
			t.Fatal(err)
		}
		if g.Error != "" {
			if !strings.Contains(res.Error, g.Error) {
				t.Errorf("line %d: error %q, want %q", i, res.Error, g.Error)
			}
			continue
		}
		if res.Text == nil || *res.Text != *g.Text || !slices.Equal(res.IDs, g.IDs) {
			t.Errorf("line %d: got %s, want text %q ids %v", i, lines[i], *g.Text, g.IDs)
		}
	}
}

func TestTokenizeReportsOverlongLinesAndContinues(t *testing.T) {
	old := maxTokenizeLine
	maxTokenizeLine = 64
	defer func() { maxTokenizeLine = old }()
	args := []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp")}
	long := `{"text": "` + strings.Repeat("x", 200) + `"}`
	got := runLines(t, args, long+"\n"+`{"text": "Hi", "add_special_tokens": false}`)
	want := []string{`{"error":"input line longer than 64 bytes"}`, `{"ids":[15359]}`}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestTokenizeFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := runTokenize(context.Background(), []string{"--help"}, strings.NewReader(""), &out, &errOut, os.LookupEnv); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	if !strings.Contains(out.String(), "add_special_tokens") || !strings.Contains(out.String(), "--chat-template") {
		t.Fatalf("--help does not explain the input shapes and flags:\n%s", out.String())
	}
	t.Setenv("KVROUTE_TOKENIZER", "")
	if err := runTokenize(context.Background(), nil, strings.NewReader(""), &out, &errOut, os.LookupEnv); err == nil {
		t.Fatal("missing --tokenizer accepted")
	}
	if err := runTokenize(context.Background(), []string{"--tokenizer", t.TempDir()}, strings.NewReader(""), &out, &errOut, os.LookupEnv); err == nil {
		t.Fatal("a folder without tokenizer.json accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := runTokenize(ctx, []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp")}, strings.NewReader(`{"text":"a"}`+"\n"), &out, &errOut, os.LookupEnv)
	if err == nil {
		t.Fatal("a cancelled context did not stop the stream")
	}
}

func TestTokenizeToolsShape(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tools.jinja")
	if err := os.WriteFile(file, []byte("{{ tools[0] | tojson }}"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := `{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}]}` + "\n"
	base := []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp"), "--chat-template", file}
	sent := runLines(t, base, in)
	vllm := runLines(t, append(base, "--tools-as", "vllm"), in)
	if !strings.HasPrefix(sent[0], `{"text":"{\"function\": {\"name\": \"f\"}}"`) {
		t.Errorf("sent: %s", sent[0])
	}
	if !strings.HasPrefix(vllm[0], `{"text":"{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": null, \"parameters\": null, \"strict\": null}}"`) {
		t.Errorf("vllm: %s", vllm[0])
	}
	var out, errOut bytes.Buffer
	if err := runTokenize(context.Background(), append(base, "--tools-as", "bogus"), strings.NewReader(in), &out, &errOut, os.LookupEnv); err == nil {
		t.Fatal("--tools-as bogus accepted")
	}
}

func TestTokenizeDefaultTemplateKwargs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kw.jinja")
	if err := os.WriteFile(file, []byte("{{ enable_thinking }}"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp"), "--chat-template", file,
		"--chat-template-kwargs", `{"enable_thinking": false}`}
	got := runLines(t, base, `{"messages": []}`+"\n"+`{"messages": [], "chat_template_kwargs": {"enable_thinking": true}}`+"\n")
	if len(got) != 2 || !strings.HasPrefix(got[0], `{"text":"False"`) || !strings.HasPrefix(got[1], `{"text":"True"`) {
		t.Fatalf("got %q", got)
	}
	var out, errOut bytes.Buffer
	bad := []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp"), "--chat-template-kwargs", "[1]"}
	if err := runTokenize(context.Background(), bad, strings.NewReader(""), &out, &errOut, os.LookupEnv); err == nil {
		t.Fatal("a non-object --chat-template-kwargs was accepted")
	}
}

func TestTokenizeContentFormat(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.jinja")
	if err := os.WriteFile(file, []byte("{{ messages[0].content is string }}"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--tokenizer", filepath.Join(tokTestdata, "mistral-sp"), "--chat-template", file}
	in := `{"messages": [{"role": "user", "content": "x"}]}` + "\n"
	for format, want := range map[string]string{"auto": "True", "string": "True", "openai": "False"} {
		got := runLines(t, append(base, "--chat-template-content-format", format), in)
		if !strings.HasPrefix(got[0], `{"text":"`+want+`"`) {
			t.Errorf("%s: %s", format, got[0])
		}
	}
	var out, errOut bytes.Buffer
	if err := runTokenize(context.Background(), append(base, "--chat-template-content-format", "x"), strings.NewReader(in), &out, &errOut, os.LookupEnv); err == nil {
		t.Fatal("a bad content format was accepted")
	}
}
