package tokenizer

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseChatRequestNormalizesAsVLLM(t *testing.T) {
	req, err := ParseChatRequest([]byte(`{
		"model": "m", "stream": true,
		"messages": [
			{"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": null}, "b", {"type": "input_text", "text": "c"}]},
			{"role": "user", "content": "hi", "name": "bob", "extra": 1},
			{"role": "assistant", "content": null, "reasoning": "think",
			 "tool_calls": [
				{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}},
				{"id": "c2", "function": {"name": "g", "arguments": "not json"}},
				{"id": "c3", "type": "function", "function": {"arguments": "[1]", "name": "h"}}
			 ]},
			{"role": "assistant", "content": "x", "tool_calls": []},
			{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}
		],
		"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
		"add_generation_prompt": false,
		"chat_template_kwargs": {"enable_thinking": false, "date_string": "x"}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{
		{Role: "system", Content: "a\nb\nc", Parts: []string{"a", "b", "c"}},
		{Role: "user", Content: "hi", Parts: []string{"hi"}, Name: "bob"},
		{Role: "assistant", Content: "", Parts: []string{}, Reasoning: "think", ToolCalls: []any{
			Object{{"id", "c1"}, {"type", "function"}, {"function", Object{{"name", "f"}, {"arguments", Object{{"z", int64(1)}, {"a", int64(2)}}}}}},
			Object{{"id", "c2"}, {"function", Object{{"name", "g"}, {"arguments", Object{}}}}},
			Object{{"id", "c3"}, {"type", "function"}, {"function", Object{{"arguments", Object{}}, {"name", "h"}}}},
		}},
		{Role: "assistant", Content: "x", Parts: []string{"x"}},
		{Role: "tool", Content: "r1\nr2", Parts: []string{"r1", "r2"}, ToolCallID: "c1"},
	}
	if !reflect.DeepEqual(req.Messages, want) {
		t.Fatalf("messages:\n got %#v\nwant %#v", req.Messages, want)
	}
	if req.generationPrompt() || len(req.Tools) != 1 || len(req.ChatTemplateKwargs) != 2 {
		t.Fatalf("request = %+v", req)
	}
	got := req.Messages[2].templateMessage()
	keys := make([]string, len(got))
	for i, f := range got {
		keys[i] = f.Key
	}
	if strings.Join(keys, ",") != "role,content,tool_calls,reasoning,reasoning_content" {
		t.Fatalf("template message keys = %v", keys)
	}
}

func TestAddGenerationPromptDefaultsToTrue(t *testing.T) {
	req, err := ParseChatRequest([]byte(`{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": null}`))
	if err != nil || !req.generationPrompt() {
		t.Fatalf("generation prompt = %v, %v", req.generationPrompt(), err)
	}
	if !(&ChatRequest{}).generationPrompt() {
		t.Fatal("zero ChatRequest has no generation prompt")
	}
}

func TestParseChatRequestRejectsMalformedBodies(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not JSON", `{"messages": [`, "chat request"},
		{"array body", `[]`, "not an object"},
		{"no messages", `{"model": "m"}`, "no messages"},
		{"messages not a list", `{"messages": {}}`, "not an array"},
		{"message not an object", `{"messages": ["hi"]}`, "messages[0]"},
		{"no role", `{"messages": [{"content": "x"}]}`, "role"},
		{"content a number", `{"messages": [{"role": "user", "content": 3}]}`, "content"},
		{"image part without url", `{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]}`, "not a string"},
		{"image part with a numeric uuid", `{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}, "uuid": 1}]}]}`, "uuid"},
		{"audio part", `{"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}`, "not supported"},
		{"tool_calls not a list", `{"messages": [{"role": "assistant", "tool_calls": {}}]}`, "tool_calls"},
		{"tool call of another type", `{"messages": [{"role": "assistant", "tool_calls": [{"type": "custom", "function": {}}]}]}`, "only function"},
		{"tool call without function", `{"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}`, "function"},
		{"tools not a list", `{"messages": [], "tools": "x"}`, "tools"},
		{"tool not an object", `{"messages": [], "tools": [1]}`, "tools[0]"},
		{"generation prompt a string", `{"messages": [], "add_generation_prompt": "yes"}`, "add_generation_prompt"},
		{"kwargs a list", `{"messages": [], "chat_template_kwargs": []}`, "chat_template_kwargs"},
		{"deep nesting", `{"messages": ` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`, "nesting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseChatRequest([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestDecodeJSONKeepsOrderAndPythonNumbers(t *testing.T) {
	v, err := DecodeJSON([]byte(`{"b": 1, "a": 1.5, "b": 2, "c": 1e400, "d": 123456789012345678901234567890}`))
	if err != nil {
		t.Fatal(err)
	}
	o := v.(Object)
	if len(o) != 4 || o[0].Key != "b" || o[0].Value != int64(2) || o[1].Value != 1.5 {
		t.Fatalf("object = %#v", o)
	}
	p := defaultPyJSON
	s, err := p.dumps(o)
	if err != nil || s != `{"b": 2, "a": 1.5, "c": Infinity, "d": 1.2345678901234568e+29}` {
		t.Fatalf("dumps = %s, %v", s, err)
	}
}

func TestTemplatesGemmaCannotParseClearly(t *testing.T) {
	_, err := ParseTemplate(realTemplate(t, "library/gemma3:1b"))
	if !errors.Is(err, ErrTemplateSyntax) || !strings.Contains(err.Error(), "parenthesis") {
		t.Fatalf("err = %v, want ErrTemplateSyntax about the parenthesized expression", err)
	}
	if len(err.Error()) > 300 {
		t.Fatalf("error repeats the template: %d bytes", len(err.Error()))
	}
	cfg := &Config{SpecialTokens: map[string]string{}, ChatTemplate: realTemplate(t, "library/gemma3:1b")}
	chat, err := NewChat(testTokenizer(t, "mistral-sp"), cfg, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := chat.CheckTemplate(); !errors.Is(err, ErrTemplateSyntax) {
		t.Fatalf("CheckTemplate = %v", err)
	}
	if _, err := chat.EncodeChat(ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}}); !errors.Is(err, ErrTemplateSyntax) {
		t.Fatalf("EncodeChat = %v", err)
	}
	if _, err := NewChat(chat.Tokenizer(), cfg, ChatOptions{TemplateOverride: "{% if %}"}); !errors.Is(err, ErrTemplateSyntax) {
		t.Fatalf("bad override accepted: %v", err)
	}
}

func TestChatTemplateVariables(t *testing.T) {
	cfg := &Config{
		SpecialTokens:  map[string]string{"bos_token": "<s>", "eos_token": "</s>"},
		ChatTemplate:   "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}|{{ enable_thinking }}|{{ tools | length }}",
		NamedTemplates: map[string]string{"tool_use": "TOOLS {{ tools[0].function.name }}"},
	}
	chat, err := NewChat(testTokenizer(t, "mistral-sp"), cfg, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	no := false
	for _, tc := range []struct {
		name string
		req  ChatRequest
		want string
	}{
		{"defaults", ChatRequest{Messages: msgs}, "<s>hi></s>||0"},
		{"no generation prompt and kwargs", ChatRequest{Messages: msgs, AddGenerationPrompt: &no,
			ChatTemplateKwargs: Object{{"enable_thinking", false}, {"bos_token", "[B]"}}}, "[B]hi</s>|False|0"},
		{"tools pick tool_use", ChatRequest{Messages: msgs, Tools: []any{Object{{"function", Object{{"name", "f"}}}}}}, "TOOLS f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chat.ApplyChatTemplate(tc.req)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	_, err = chat.ApplyChatTemplate(ChatRequest{Messages: msgs, ChatTemplateKwargs: Object{{"messages", []any{}}}})
	if err == nil || !strings.Contains(err.Error(), "messages") {
		t.Fatalf("kwargs overriding messages: %v", err)
	}
}

func TestRaiseExceptionAndRenderErrors(t *testing.T) {
	tpl, err := ParseTemplate("{% if messages | length == 0 %}{{ raise_exception('No messages!') }}{% endif %}ok")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tpl.Render(map[string]any{"messages": []any{}})
	var te *TemplateError
	if !errors.As(err, &te) || te.Message != "No messages!" {
		t.Fatalf("err = %v, want TemplateError", err)
	}
	if out, err := tpl.Render(map[string]any{"messages": []any{"x"}}); err != nil || out != "ok" {
		t.Fatalf("out = %q, %v", out, err)
	}
	bad, err := ParseTemplate("{{ x | tojson(bogus=1) }}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Render(map[string]any{"x": 1}); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("err = %v", err)
	}
}

func TestStrftimeMatchesPython(t *testing.T) {
	at := time.Date(2024, 7, 26, 9, 5, 3, 0, time.UTC)
	// datetime(2024,7,26,9,5,3).strftime(...) in Python.
	want := "26 Jul 2024 Friday July 09:05:03 09AM 208 24 07 26 Fri %"
	if got := pyStrftime(at, "%d %b %Y %A %B %H:%M:%S %I%p %j %y %m %e %a %%"); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	tpl, err := ParseTemplate(`{{ strftime_now("%Y") }}`)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tpl.Render(nil); err != nil || len(got) != 4 {
		t.Fatalf("strftime_now = %q, %v", got, err)
	}
}

func FuzzParseChatRequest(f *testing.F) {
	f.Add([]byte(`{"messages": [{"role": "user", "content": "hi"}]}`))
	f.Add([]byte(`{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, {}]}"}}]}], "tools": [{"type": "function", "function": {"name": "f"}}], "add_generation_prompt": false, "chat_template_kwargs": {"enable_thinking": true}}`))
	f.Add([]byte(`{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]}`))
	f.Add([]byte(`{"messages": [[[[[`))
	f.Add([]byte(`{"messages": [], "x": 1e999, "y": -0, "z": "\ud800"}`))
	tpl, err := ParseTemplate("{{ messages | tojson }}{% for m in messages %}{{ m.role }}{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson(indent=1) }}{% endif %}{% endfor %}{{ tools | tojson }}")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseChatRequest(body)
		if err != nil {
			return
		}
		msgs := make([]any, len(req.Messages))
		for i := range req.Messages {
			msgs[i] = req.Messages[i].templateMessage()
		}
		vars := map[string]any{"messages": msgs}
		if req.Tools != nil {
			vars["tools"] = req.Tools
		}
		if _, err := tpl.Render(vars); err != nil {
			t.Fatalf("a parsed request does not render: %v", err)
		}
	})
}

func TestContinueFinalMessage(t *testing.T) {
	cfg := &Config{SpecialTokens: map[string]string{}, ChatTemplate: "{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}<end>{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"}
	chat, err := NewChat(testTokenizer(t, "mistral-sp"), cfg, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	no, yes := false, true
	msgs := []Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "  Once upon  "}}
	got, err := chat.ApplyChatTemplate(ChatRequest{Messages: msgs, AddGenerationPrompt: &no, ContinueFinalMessage: true})
	if err != nil || got != "[user]hi<end>[assistant]Once upon" {
		t.Fatalf("got %q, %v", got, err)
	}
	for _, agp := range []*bool{nil, &yes} {
		if _, err := chat.ApplyChatTemplate(ChatRequest{Messages: msgs, AddGenerationPrompt: agp, ContinueFinalMessage: true}); err == nil {
			t.Fatalf("add_generation_prompt=%v with continue_final_message accepted", agp)
		}
	}
}

// Template files are operator input: parsing any text returns a template or
// an error, never a panic.
func FuzzParseTemplate(f *testing.F) {
	for _, key := range []string{"library/llama3.1:8b", "library/qwen3:0.6b", "library/gemma3:1b", "library/deepseek-v3:671b"} {
		f.Add(realTemplate(f, key))
	}
	f.Add("{% for %}")
	f.Add("{{ x | tojson(indent=")
	f.Add("{% set ns = namespace(a=1) %}{{ ns.a[::-1] }}")
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := ParseTemplate(src)
		if err == nil && tpl.Source() != src {
			t.Fatal("template lost its source")
		}
	})
}

func TestToolsAsVLLMReshapesLikeModelDump(t *testing.T) {
	req, err := ParseChatRequest([]byte(`{"messages": [{"role": "user", "content": "x"}], "tools": [
		{"function": {"parameters": {"type": "object", "properties": {}}, "name": "f", "x_extra": 1}, "note": "n"},
		{"type": "function", "function": {"name": "g", "description": "d", "strict": true}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &Config{SpecialTokens: map[string]string{}, ChatTemplate: "{% for t in tools %}{{ t | tojson }}\n{% endfor %}"}
	for _, tc := range []struct {
		shape ToolsShape
		want  string
	}{
		{ToolsAsSent, `{"function": {"parameters": {"type": "object", "properties": {}}, "name": "f", "x_extra": 1}, "note": "n"}
{"type": "function", "function": {"name": "g", "description": "d", "strict": true}}
`},
		{ToolsAsVLLM, `{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object", "properties": {}}, "strict": null, "x_extra": 1}, "note": "n"}
{"type": "function", "function": {"name": "g", "description": "d", "parameters": null, "strict": true}}
`},
	} {
		chat, err := NewChat(testTokenizer(t, "mistral-sp"), cfg, ChatOptions{Tools: tc.shape})
		if err != nil {
			t.Fatal(err)
		}
		got, err := chat.ApplyChatTemplate(req)
		if err != nil || got != tc.want {
			t.Errorf("shape %d:\n got %s\nwant %s (%v)", tc.shape, got, tc.want, err)
		}
	}
}

func TestDefaultKwargsYieldToTheRequest(t *testing.T) {
	cfg := &Config{SpecialTokens: map[string]string{}, ChatTemplate: "{{ enable_thinking }}|{{ date_string }}"}
	chat, err := NewChat(testTokenizer(t, "mistral-sp"), cfg, ChatOptions{
		DefaultKwargs: Object{{"enable_thinking", false}, {"date_string", "d0"}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := chat.ApplyChatTemplate(ChatRequest{ChatTemplateKwargs: Object{{"date_string", "d1"}}})
	if err != nil || got != "False|d1" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := NewChat(chat.Tokenizer(), cfg, ChatOptions{DefaultKwargs: Object{{"messages", nil}}}); err == nil {
		t.Fatal("default kwargs may set messages")
	}
}

func TestContentFormatFollowsTheTemplate(t *testing.T) {
	for _, tc := range []struct {
		src   string
		loops bool
	}{
		{"{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}", true},
		{"{%- set loop_messages = messages[1:] %}{% for message in loop_messages %}{%- for item in message.content -%}{{ item }}{% endfor %}{% endfor %}", true},
		{"{% for m in messages %}{{ m.content }}{% endfor %}{% for x in other.content %}{% endfor %}", false},
		{realTemplate(t, "library/qwen3:0.6b"), false},
		{realTemplate(t, "library/llama3.1:8b"), false},
	} {
		if got := loopsOverContent(tc.src); got != tc.loops {
			t.Errorf("loopsOverContent(%.60q) = %v, want %v", tc.src, got, tc.loops)
		}
	}
	if !loopsOverContent(realTemplate(t, "library/gemma3:1b")) {
		t.Error("Gemma 3's template loops over content")
	}
	cfg := &Config{SpecialTokens: map[string]string{},
		ChatTemplate: "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}{% else %}{% for p in m['content'] %}[{{ p.type }}={{ p.text }}]{% endfor %}{% endif %};{% endfor %}"}
	req, err := ParseChatRequest([]byte(`{"messages": [
		{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
		{"role": "assistant", "content": null},
		{"role": "tool", "content": [{"type": "text", "text": "r"}]},
		{"role": "user", "content": "plain"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		format ContentFormat
		want   string
	}{
		{ContentAuto, "user:[text=a][text=b];assistant:;tool:r;user:[text=plain];"},
		{ContentParts, "user:[text=a][text=b];assistant:;tool:r;user:[text=plain];"},
		{ContentString, "user:a\nb;assistant:;tool:r;user:plain;"},
	} {
		chat, err := NewChat(testTokenizer(t, "mistral-sp"), cfg, ChatOptions{Content: f.format})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := chat.ApplyChatTemplate(req); err != nil || got != f.want {
			t.Errorf("format %d: got %q, %v; want %q", f.format, got, err, f.want)
		}
	}
}

func TestEmptyToolsAreNoTools(t *testing.T) {
	req, err := ParseChatRequest([]byte(`{"messages": [{"role": "user", "content": "x"}], "tools": []}`))
	if err != nil || req.Tools != nil {
		t.Fatalf("tools = %#v, %v; want nil", req.Tools, err)
	}
}

// BenchmarkChatParseBody decodes the OpenAI body of the 20-turn, ~32k-token
// conversation (about 130 KB), keeping key order.
func BenchmarkChatParseBody(b *testing.B) {
	req := longConversation(20)
	msgs := make([]any, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = Object{{"role", m.Role}, {"content", m.Content}}
	}
	p := defaultPyJSON
	body, err := p.dumps(Object{{"model", "m"}, {"messages", msgs}, {"stream", true}})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseChatRequest([]byte(body)); err != nil {
			b.Fatal(err)
		}
	}
}

func TestChatImagePartsReachLoopingTemplates(t *testing.T) {
	req, err := ParseChatRequest([]byte(`{"messages": [{"role": "user", "content": [
		{"type": "text", "text": "a"},
		{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}, "uuid": "u1"},
		{"type": "text", "text": "b"},
		{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	m := req.Messages[0]
	if len(m.Images) != 2 || m.Images[0].At != 1 || m.Images[0].UUID != "u1" || m.Images[1].At != 2 || m.Images[1].URL != "https://x/y.png" {
		t.Fatalf("images: %+v", m.Images)
	}
	got := m.templateMessageAs(true)
	content, _ := got.Get("content")
	var kinds []any
	for _, p := range content.([]any) {
		k, _ := p.(Object).Get("type")
		kinds = append(kinds, k)
	}
	if fmt.Sprint(kinds) != "[text image text image]" {
		t.Fatalf("content order %v", kinds)
	}
}
