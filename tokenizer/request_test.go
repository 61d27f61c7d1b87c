package tokenizer

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestParseRequestReadsTheFieldsTheRouterUses(t *testing.T) {
	r, err := ParseRequest([]byte(`{"model": "m", "cache_salt": "s", "stream": true, "max_tokens": 7,
		"max_completion_tokens": 9, "nvext": {"agent_hints": {"priority": 2.5}},
		"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || r.BadModel || r.CacheSalt != "s" || !r.Stream || r.MaxTokens != 9 ||
		!r.HasPriority || r.Priority != 2.5 || r.Messages != 2 || r.Prompts != nil || !errors.Is(r.PromptErr, ErrNoPrompt) {
		t.Fatalf("%+v", r)
	}
	chat, err := r.Chat()
	if err != nil || len(chat.Messages) != 2 || chat.Messages[1].Content != "yo" {
		t.Fatalf("chat %+v, %v", chat, err)
	}
	want, err := ParseChatRequest([]byte(`{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}`))
	if err != nil || !reflect.DeepEqual(chat, want) {
		t.Fatalf("Chat differs from ParseChatRequest: %+v, %+v", chat, want)
	}
}

func TestParseRequestLeavesMistypedFieldsZero(t *testing.T) {
	r, err := ParseRequest([]byte(`{"model": 7, "cache_salt": 1, "stream": "yes", "max_tokens": -3,
		"max_completion_tokens": 1.5, "nvext": {"agent_hints": {"priority": "high"}}, "messages": {}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "" || !r.BadModel || r.CacheSalt != "" || r.Stream || r.MaxTokens != 0 || r.HasPriority || r.Messages != 0 {
		t.Fatalf("%+v", r)
	}
	if _, err := r.Chat(); err == nil {
		t.Fatal("messages that are an object rendered")
	}
}

func TestParseRequestPrompts(t *testing.T) {
	text := func(s string) Prompt { return Prompt{Text: s} }
	ids := func(n ...uint32) Prompt { return Prompt{IDs: append([]uint32{}, n...), IsIDs: true} }
	for _, tc := range []struct {
		body string
		want []Prompt
		err  string // "" for none
	}{
		{`"a"`, []Prompt{text("a")}, ""},
		{`[1, 2]`, []Prompt{ids(1, 2)}, ""},
		{`[[1], [2, 3]]`, []Prompt{ids(1), ids(2, 3)}, ""},
		{`["a", "b"]`, []Prompt{text("a"), text("b")}, ""},
		{`["a", 5]`, []Prompt{text("a")}, "prompt 1 is neither a string nor a list of token ids"},
		{`["a", [-1]]`, []Prompt{text("a")}, "prompt 1: token ids must be integers in 0..4294967295"},
		{`[]`, []Prompt{ids()}, "prompt is an empty list"},
		{`[[]]`, []Prompt{ids()}, ""},
		{`[1, -2]`, nil, "token ids must be integers in 0..4294967295"},
		{`[4294967296]`, nil, "token ids must be integers in 0..4294967295"},
		{`[1.5]`, []Prompt{}, "prompt 0 is neither a string nor a list of token ids"},
		{`7`, nil, "prompt is neither a string nor a list"},
		{`null`, nil, "prompt is neither a string nor a list"},
	} {
		r, err := ParseRequest([]byte(`{"prompt": ` + tc.body + `}`))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		gotErr := ""
		if r.PromptErr != nil {
			gotErr = r.PromptErr.Error()
		}
		if gotErr != tc.err || len(r.Prompts) != len(tc.want) || (len(tc.want) > 0 && !reflect.DeepEqual(r.Prompts, tc.want)) {
			t.Errorf("%s: prompts %#v, err %q; want %#v, %q", tc.body, r.Prompts, gotErr, tc.want, tc.err)
		}
	}
}

func TestParseRequestRefusesWhatIsNotAnObject(t *testing.T) {
	for _, body := range []string{`[1]`, `"x"`, `null`} {
		if _, err := ParseRequest([]byte(body)); !errors.Is(err, ErrNotObject) {
			t.Errorf("%s: %v, want ErrNotObject", body, err)
		}
	}
	for _, body := range []string{`{"model":`, ``, `{} {}`} {
		if _, err := ParseRequest([]byte(body)); err == nil || errors.Is(err, ErrNotObject) {
			t.Errorf("%q: %v, want a syntax error", body, err)
		}
	}
	deep := []byte(`{"x": ` + string(bytes.Repeat([]byte("["), MaxJSONDepth+1)) + `}`)
	if _, err := ParseRequest(deep); !errors.Is(err, ErrJSONTooDeep) {
		t.Errorf("deep body: %v, want ErrJSONTooDeep", err)
	}
}

// Each image part knows where its '{' lies in the body, and whether it has
// a uuid key, so the body can be rewritten around it without a second pass.
func TestParseRequestPlacesImageParts(t *testing.T) {
	body := []byte(`{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
		{"type": "image_url", "image_url": {"url": "u1"}},
		{ "image_url": "u2", "uuid": null, "type": "image_url"}]},
		{"role": "user", "content": [{"type":"image_url","image_url":{"url":"u3"},"uuid":"c"}]}],
		"tools": [{"type": "image_url"}]}`)
	r, err := ParseRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	chat, err := r.Chat()
	if err != nil {
		t.Fatal(err)
	}
	var parts []ImagePart
	for _, m := range chat.Messages {
		parts = append(parts, m.Images...)
	}
	if len(parts) != 3 {
		t.Fatalf("parts %+v", parts)
	}
	for i, want := range []struct {
		prefix string
		uuid   bool
	}{{`{"type": "image_url"`, false}, {`{ "image_url": "u2"`, true}, {`{"type":"image_url","image_url":{"url":"u3"}`, true}} {
		if !bytes.HasPrefix(body[parts[i].Offset:], []byte(want.prefix)) || parts[i].HasUUIDKey != want.uuid {
			t.Errorf("part %d at %d (uuid key %v): %.30q", i, parts[i].Offset, parts[i].HasUUIDKey, body[parts[i].Offset:])
		}
	}
	// Read from an already decoded body, the parts have no place.
	plain, err := ParseChatRequest(body)
	if err != nil || plain.Messages[0].Images[0].Offset != 0 {
		t.Fatalf("ParseChatRequest: %+v, %v", plain.Messages[0].Images, err)
	}
}

// FuzzParseRequest: whatever the body, ParseRequest and Chat do not panic;
// a body DecodeJSON accepts is accepted, with the same chat as
// ParseChatRequest reads, and each image part placed at a '{' of the body.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"nvext":{"agent_hints":{"priority":2}}}`,
		`{"prompt":[[1,2,3],[4]],"max_completion_tokens":1e3}`, `{"prompt":["a",5]}`, `{"prompt":[]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"},"uuid":null},{"type":"text","text":"x"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"a"}]}],"messages":[{"role":"user","content":[{"type":"image_url","image_url":"b"}]}]}`,
		`[1]`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseRequest(body)
		_, derr := DecodeJSON(body)
		if (err == nil) != (derr == nil) && !errors.Is(err, ErrNotObject) {
			t.Fatalf("ParseRequest %v, DecodeJSON %v", err, derr)
		}
		if err != nil {
			return
		}
		if r.MaxTokens < 0 || (r.PromptErr == nil && len(r.Prompts) == 0) {
			t.Fatalf("%+v", r)
		}
		chat, err := r.Chat()
		want, werr := ParseChatRequest(body)
		if (err == nil) != (werr == nil) {
			t.Fatalf("Chat %v, ParseChatRequest %v", err, werr)
		}
		if err != nil {
			return
		}
		for mi := range chat.Messages {
			for pi, p := range chat.Messages[mi].Images {
				if p.Offset <= 0 || p.Offset >= len(body) || body[p.Offset] != '{' {
					t.Fatalf("image part at %d, not at a '{'", p.Offset)
				}
				p.Offset = 0
				if p != want.Messages[mi].Images[pi] {
					t.Fatalf("image part %+v, ParseChatRequest %+v", p, want.Messages[mi].Images[pi])
				}
			}
		}
		if len(chat.Messages) != len(want.Messages) {
			t.Fatalf("%d messages, ParseChatRequest %d", len(chat.Messages), len(want.Messages))
		}
	})
}

// BenchmarkParseRequest reads the 20-turn conversation's body as the
// picker does: ParseRequest, then Chat.
func BenchmarkParseRequest(b *testing.B) {
	req := longConversation(20)
	msgs := make([]any, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = Object{{"role", m.Role}, {"content", m.Content}}
	}
	body, err := defaultPyJSON.dumps(Object{{"model", "m"}, {"messages", msgs}, {"stream", true}})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := ParseRequest([]byte(body))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Chat(); err != nil {
			b.Fatal(err)
		}
	}
}
