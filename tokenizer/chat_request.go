package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// ChatRequest is the part of an OpenAI chat completions body that decides the
// prompt: what the model server feeds its chat template. The zero value of
// AddGenerationPrompt means "absent", which vLLM treats as true.
type ChatRequest struct {
	// Messages are the conversation, already normalized as vLLM normalizes
	// them (see Message).
	Messages []Message
	// Tools are the request's tool definitions, each normally an Object, in
	// request order. Nil means no tools.
	Tools []any
	// AddGenerationPrompt, when nil, means true.
	AddGenerationPrompt *bool
	// ChatTemplateKwargs become extra template variables (enable_thinking,
	// date_string, ...), as transformers passes them.
	ChatTemplateKwargs Object
	// ContinueFinalMessage renders the conversation so that the model goes on
	// writing the last message (an assistant prefill): the text ends where
	// that message's content ends. It excludes a generation prompt.
	ContinueFinalMessage bool
}

// Message is one chat message as the template sees it. vLLM rebuilds every
// message before rendering: content becomes a single string (text parts joined
// with "\n", null becomes ""), assistant tool call arguments given as JSON
// strings become objects, and only the fields below are kept, in this order.
type Message struct {
	Role    string
	Content string
	// Parts are the text parts as sent, before joining: a string content is
	// one part, null content none. Templates that loop over a message's
	// content (vLLM's "openai" content format) see them as
	// [{"type": "text", "text": ...}]. When nil, Content stands for them.
	Parts []string
	// ToolCalls are an assistant's tool calls (Objects with id, type,
	// function{name, arguments}); nil or empty means none.
	ToolCalls []any
	// Reasoning is an assistant's reasoning text; the template sees it as both
	// "reasoning" and "reasoning_content". Empty means absent.
	Reasoning string
	// ToolCallID is a tool result's tool_call_id; empty means absent.
	ToolCallID string
	// Name is the optional participant name; empty means absent.
	Name string
	// Images are the message's image parts ("image_url" content parts), in
	// order. A template that loops over content sees each as {"type":
	// "image"} at its place among the text parts, as vLLM's "openai" content
	// format hands it over; nil means none.
	Images []ImagePart
}

// ImagePart is one image content part of a chat message.
type ImagePart struct {
	// At is the number of text parts before the image in the message.
	At int
	// URL is image_url.url: a data: URL or a remote address.
	URL string
	// UUID is the part's "uuid" (vLLM 0.10.2+), "" when absent.
	UUID string
	// HasUUIDKey reports that the part has a "uuid" key, even a null one.
	HasUUIDKey bool
	// Offset is where the part's opening '{' lies in the body it was
	// decoded from, for rewriting the body around it (the router adds a
	// "uuid"); ParseRequest sets it, and 0 means not known.
	Offset int
}

// generationPrompt resolves the default of AddGenerationPrompt.
func (r *ChatRequest) generationPrompt() bool {
	return r.AddGenerationPrompt == nil || *r.AddGenerationPrompt
}

// templateMessage builds the ordered dict vLLM hands to the template.
func (m *Message) templateMessage() Object { return m.templateMessageAs(false) }

// templateMessageAs builds the ordered dict vLLM hands to the template; with
// partsContent the content is a list of text parts (vLLM's "openai" content
// format), except for tool results, which vLLM always flattens to a string.
func (m *Message) templateMessageAs(partsContent bool) Object {
	var content any = m.Content
	if partsContent && m.Role != "tool" {
		parts := m.Parts
		if parts == nil && m.Content != "" {
			parts = []string{m.Content}
		}
		list := make([]any, 0, len(parts)+len(m.Images))
		img := 0
		for i, p := range parts {
			for ; img < len(m.Images) && m.Images[img].At <= i; img++ {
				list = append(list, Object{{"type", "image"}})
			}
			list = append(list, Object{{"type", "text"}, {"text", p}})
		}
		for ; img < len(m.Images); img++ {
			list = append(list, Object{{"type", "image"}})
		}
		content = list
	}
	o := make(Object, 0, 6)
	o = append(o, Field{"role", m.Role}, Field{"content", content})
	if len(m.ToolCalls) > 0 {
		o = append(o, Field{"tool_calls", m.ToolCalls})
	}
	if m.Reasoning != "" {
		o = append(o, Field{"reasoning", m.Reasoning}, Field{"reasoning_content", m.Reasoning})
	}
	if m.ToolCallID != "" {
		o = append(o, Field{"tool_call_id", m.ToolCallID})
	}
	if m.Name != "" {
		o = append(o, Field{"name", m.Name})
	}
	return o
}

// ParseChatRequest decodes an OpenAI chat completions body, keeping object
// key order, and normalizes its messages as vLLM does. Fields other than
// messages, tools, add_generation_prompt and chat_template_kwargs are ignored.
func ParseChatRequest(body []byte) (ChatRequest, error) {
	v, err := DecodeJSON(body)
	if err != nil {
		return ChatRequest{}, fmt.Errorf("chat request: %w", err)
	}
	top, ok := v.(Object)
	if !ok {
		return ChatRequest{}, fmt.Errorf("chat request: body is a JSON %s, not an object", jsonKind(v))
	}
	return ChatRequestFromObject(top)
}

// ChatRequestFromObject is ParseChatRequest for an already decoded body.
func ChatRequestFromObject(top Object) (ChatRequest, error) {
	return chatRequestFromObject(top, nil)
}

// chatRequestFromObject reads the chat of top; imageAt (from a decoder that
// tracked image parts, or nil) gives each image part its Offset.
func chatRequestFromObject(top Object, imageAt map[*Field]int) (ChatRequest, error) {
	var req ChatRequest
	rawMsgs, ok := top.Get("messages")
	if !ok {
		return req, errors.New("chat request: no messages")
	}
	list, ok := rawMsgs.([]any)
	if !ok {
		return req, fmt.Errorf("chat request: messages is a JSON %s, not an array", jsonKind(rawMsgs))
	}
	req.Messages = make([]Message, 0, len(list))
	for i, raw := range list {
		m, err := parseMessage(raw, imageAt)
		if err != nil {
			return ChatRequest{}, fmt.Errorf("chat request: messages[%d]: %w", i, err)
		}
		req.Messages = append(req.Messages, m)
	}
	if tools, ok := top.Get("tools"); ok && tools != nil {
		tl, ok := tools.([]any)
		if !ok {
			return ChatRequest{}, fmt.Errorf("chat request: tools is a JSON %s, not an array", jsonKind(tools))
		}
		for i, t := range tl {
			if _, ok := t.(Object); !ok {
				return ChatRequest{}, fmt.Errorf("chat request: tools[%d] is a JSON %s, not an object", i, jsonKind(t))
			}
		}
		if len(tl) > 0 { // recent vLLM hands templates None for an empty list
			req.Tools = tl
		}
	}
	if agp, ok := top.Get("add_generation_prompt"); ok && agp != nil {
		b, ok := agp.(bool)
		if !ok {
			return ChatRequest{}, fmt.Errorf("chat request: add_generation_prompt is a JSON %s, not a boolean", jsonKind(agp))
		}
		req.AddGenerationPrompt = &b
	}
	if cfm, ok := top.Get("continue_final_message"); ok && cfm != nil {
		b, ok := cfm.(bool)
		if !ok {
			return ChatRequest{}, fmt.Errorf("chat request: continue_final_message is a JSON %s, not a boolean", jsonKind(cfm))
		}
		req.ContinueFinalMessage = b
	}
	if kw, ok := top.Get("chat_template_kwargs"); ok && kw != nil {
		o, ok := kw.(Object)
		if !ok {
			return ChatRequest{}, fmt.Errorf("chat request: chat_template_kwargs is a JSON %s, not an object", jsonKind(kw))
		}
		req.ChatTemplateKwargs = o
	}
	return req, nil
}

func parseMessage(raw any, imageAt map[*Field]int) (Message, error) {
	obj, ok := raw.(Object)
	if !ok {
		return Message{}, fmt.Errorf("message is a JSON %s, not an object", jsonKind(raw))
	}
	var m Message
	role, _ := obj.Get("role")
	if m.Role, ok = role.(string); !ok {
		return Message{}, errors.New("message has no string role")
	}
	content, _ := obj.Get("content")
	parts, images, err := messageParts(content, imageAt)
	if err != nil {
		return Message{}, err
	}
	m.Parts, m.Images = parts, images
	m.Content = strings.Join(parts, "\n")
	switch m.Role {
	case "assistant":
		if tc, ok := obj.Get("tool_calls"); ok && tc != nil {
			calls, err := normalizeToolCalls(tc)
			if err != nil {
				return Message{}, err
			}
			if len(calls) > 0 { // vLLM drops an empty list
				m.ToolCalls = calls
			}
		}
		if r, ok := obj.Get("reasoning"); ok && r != nil {
			if m.Reasoning, ok = r.(string); !ok {
				return Message{}, fmt.Errorf("reasoning is a JSON %s, not a string", jsonKind(r))
			}
		}
	case "tool":
		if id, ok := obj.Get("tool_call_id"); ok && id != nil {
			if m.ToolCallID, ok = id.(string); !ok {
				return Message{}, fmt.Errorf("tool_call_id is a JSON %s, not a string", jsonKind(id))
			}
		}
	}
	if n, ok := obj.Get("name"); ok {
		m.Name, _ = n.(string)
	}
	return m, nil
}

// messageParts lists the text parts of content (vLLM's "string" content
// format joins them with "\n") and its image parts.
func messageParts(content any, imageAt map[*Field]int) ([]string, []ImagePart, error) {
	switch c := content.(type) {
	case nil:
		return []string{}, nil, nil
	case string:
		return []string{c}, nil, nil
	case []any:
		texts := make([]string, 0, len(c))
		var images []ImagePart
		for i, part := range c {
			if img, ok, err := partImage(part, imageAt); ok || err != nil {
				if err != nil {
					return nil, nil, fmt.Errorf("content[%d]: %w", i, err)
				}
				img.At = len(texts)
				images = append(images, img)
				continue
			}
			t, ok, err := partText(part)
			if err != nil {
				return nil, nil, fmt.Errorf("content[%d]: %w", i, err)
			}
			if ok {
				texts = append(texts, t)
			}
		}
		return texts, images, nil
	}
	return nil, nil, fmt.Errorf("content is a JSON %s, not a string or an array of parts", jsonKind(content))
}

// partImage reads an OpenAI image part: {"type": "image_url", "image_url":
// {"url": ...} or "...", "uuid": ...}. ok is false for other part types.
func partImage(part any, imageAt map[*Field]int) (ImagePart, bool, error) {
	obj, isObj := part.(Object)
	if !isObj {
		return ImagePart{}, false, nil
	}
	if typ, _ := obj.Get("type"); typ != "image_url" {
		return ImagePart{}, false, nil
	}
	var img ImagePart
	switch u, _ := obj.Get("image_url"); x := u.(type) {
	case string:
		img.URL = x
	case Object:
		url, _ := x.Get("url")
		s, ok := url.(string)
		if !ok {
			return ImagePart{}, true, fmt.Errorf("image_url.url is a JSON %s, not a string", jsonKind(url))
		}
		img.URL = s
	default:
		return ImagePart{}, true, fmt.Errorf("image_url is a JSON %s, not an object", jsonKind(u))
	}
	img.Offset = imageAt[&obj[0]] // obj has a "type" field
	id, hasID := obj.Get("uuid")
	img.HasUUIDKey = hasID
	if hasID && id != nil {
		s, ok := id.(string)
		if !ok {
			return ImagePart{}, true, fmt.Errorf("image part uuid is a JSON %s, not a string", jsonKind(id))
		}
		img.UUID = s
	}
	return img, true, nil
}

// partText returns a content part's text; ok is false for text parts whose
// text is null, which vLLM skips.
func partText(part any) (string, bool, error) {
	if s, ok := part.(string); ok {
		return s, true, nil
	}
	obj, ok := part.(Object)
	if !ok {
		return "", false, fmt.Errorf("part is a JSON %s, not an object", jsonKind(part))
	}
	typ, _ := obj.Get("type")
	key := ""
	switch typ {
	case "text", "input_text", "output_text", "thinking":
		key = "text"
	case "refusal":
		key = "refusal"
	default:
		return "", false, fmt.Errorf("content part type %v is not supported (text only)", typ)
	}
	v, _ := obj.Get(key)
	if v == nil {
		return "", false, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", false, fmt.Errorf("%s part's %s is a JSON %s, not a string", typ, key, jsonKind(v))
	}
	return s, true, nil
}

// normalizeToolCalls applies vLLM's post-processing: function arguments given
// as a JSON string are parsed into an object (anything that is not an object,
// including bad JSON, becomes {}); an empty list means no tool calls.
func normalizeToolCalls(tc any) ([]any, error) {
	list, ok := tc.([]any)
	if !ok {
		return nil, fmt.Errorf("tool_calls is a JSON %s, not an array", jsonKind(tc))
	}
	out := make([]any, len(list))
	for i, item := range list {
		call, ok := item.(Object)
		if !ok {
			return nil, fmt.Errorf("tool_calls[%d] is a JSON %s, not an object", i, jsonKind(item))
		}
		call = append(Object(nil), call...)
		if typ, ok := call.Get("type"); ok && typ != "function" {
			return nil, fmt.Errorf("tool_calls[%d] has type %v; only function calls are supported", i, typ)
		}
		fnRaw, _ := call.Get("function")
		fn, ok := fnRaw.(Object)
		if !ok {
			return nil, fmt.Errorf("tool_calls[%d].function is a JSON %s, not an object", i, jsonKind(fnRaw))
		}
		fn = append(Object(nil), fn...)
		args, _ := fn.Get("arguments")
		fn.Set("arguments", toolArguments(args))
		call.Set("function", fn)
		out[i] = call
	}
	return out, nil
}

func toolArguments(args any) any {
	switch a := args.(type) {
	case Object:
		if len(a) == 0 {
			return Object{}
		}
		return a
	case string:
		if a == "" {
			return Object{}
		}
		parsed, err := DecodeJSON([]byte(a))
		if obj, ok := parsed.(Object); err == nil && ok {
			return obj
		}
		return Object{}
	}
	return Object{} // lists, numbers, booleans, null: vLLM coerces to {}
}

// jsonKind names a decoded value's JSON type for error messages.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case int64, float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case Object:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
