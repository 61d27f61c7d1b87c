package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/tokenizer"
)

const tokenizeUsage = `Usage:
  kvroute tokenize --tokenizer DIR [--chat-template FILE]

Tokenizes exactly as kvroute routes: reads JSON lines on stdin and writes one
JSON line per input line on stdout, in order.

  {"text": "...", "add_special_tokens": false}   -> {"ids": [...]}
      add_special_tokens defaults to true (a completions prompt)
  {"messages": [...], "tools": [...], "add_generation_prompt": true,
   "chat_template_kwargs": {...}}                -> {"text": "<rendered>", "ids": [...]}
      an OpenAI chat body (continue_final_message is honoured too); other
      fields (model, stream, ...) are ignored;
      rendered with the chat template and encoded without special tokens,
      as vLLM does
  anything that fails                            -> {"error": "..."}
      a bad line never stops the stream

Use it to answer "why did this request miss the cache?": compare its ids
with what the model server logged.

tokenize loads one tokenizer, so --tokenizer is a folder; serve's MODEL=DIR
form is accepted too (the MODEL= part is dropped), and so is MODEL=FILE for
--chat-template. KVROUTE_TOKENIZER and KVROUTE_CHAT_TEMPLATE are single paths
here; the router (kvroute serve) reads its per-model tokenizers from
KVROUTE_TOKENIZERS and KVROUTE_CHAT_TEMPLATES (MODEL=DIR,... and
MODEL=FILE,...) instead.`

// singlePath accepts serve's MODEL=PATH form where tokenize wants one
// path: a value with "=" that is not itself an existing path loses its
// MODEL= part.
func singlePath(v string) string {
	if _, err := os.Stat(v); err == nil {
		return v
	}
	if _, p, ok := strings.Cut(v, "="); ok && p != "" {
		return p
	}
	return v
}

// tokenizeLine is one input line: a completions prompt or a chat body.
type tokenizeLine struct {
	Text             *string `json:"text"`
	AddSpecialTokens *bool   `json:"add_special_tokens"`
	Messages         any     `json:"messages"`
}

// Output lines, one shape each.
type (
	idsResult struct {
		IDs []uint32 `json:"ids"`
	}
	chatResult struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	}
	errorResult struct {
		Error string `json:"error"`
	}
)

// maxTokenizeLine bounds one input line.
var maxTokenizeLine = 64 << 20

// runTokenize implements `kvroute tokenize`.
func runTokenize(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	cmd := cli.NewCommand("kvroute tokenize", tokenizeUsage)
	fs := cmd.Flags
	dir := fs.String("tokenizer", "", "`DIR` with tokenizer.json and tokenizer_config.json (serve's MODEL=DIR is accepted too)")
	tmpl := fs.String("chat-template", "", "chat template `FILE` that replaces the tokenizer's own (MODEL=FILE is accepted too)")
	toolsAs := fs.String("tools-as", "sent", "how tools reach the template: sent (as the request wrote them) or vllm (as vLLM's model_dump reshapes them)")
	kwargs := fs.String("chat-template-kwargs", "", `JSON object of default template variables, e.g. {"enable_thinking": false}; a request's own chat_template_kwargs win`)
	contentFormat := fs.String("chat-template-content-format", "auto", "how message content reaches the template, as vLLM's flag: auto, string or openai")
	if err := cmd.Parse(args, lookupEnv, stdout, false); err != nil {
		return err
	}
	if *dir == "" {
		return cmd.Usagef("--tokenizer is required")
	}
	*dir = singlePath(*dir)
	if *tmpl != "" {
		*tmpl = singlePath(*tmpl)
	}
	opts := tokenizer.ChatOptions{}
	switch *toolsAs {
	case "sent":
		opts.Tools = tokenizer.ToolsAsSent
	case "vllm":
		opts.Tools = tokenizer.ToolsAsVLLM
	default:
		return cmd.Usagef("--tools-as must be sent or vllm, not %q", *toolsAs)
	}
	switch *contentFormat {
	case "auto":
		opts.Content = tokenizer.ContentAuto
	case "string":
		opts.Content = tokenizer.ContentString
	case "openai":
		opts.Content = tokenizer.ContentParts
	default:
		return cmd.Usagef("--chat-template-content-format must be auto, string or openai, not %q", *contentFormat)
	}
	if *kwargs != "" {
		v, err := tokenizer.DecodeJSON([]byte(*kwargs))
		obj, ok := v.(tokenizer.Object)
		if err != nil || !ok {
			return fmt.Errorf("tokenize: --chat-template-kwargs must be a JSON object (%w)", err)
		}
		opts.DefaultKwargs = obj
	}
	chat, err := tokenizer.LoadChat(*dir, *tmpl, opts)
	if err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}

	in := bufio.NewReaderSize(stdin, 1<<20)
	out := bufio.NewWriter(stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false) // rendered prompts are full of <|tokens|>
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, tooLong, readErr := readLine(in)
		if readErr != nil && !errors.Is(readErr, io.EOF) {
			return fmt.Errorf("tokenize: read stdin: %w", readErr)
		}
		if errors.Is(readErr, io.EOF) && len(line) == 0 && !tooLong {
			return nil
		}
		var res any
		if tooLong {
			res = errorResult{Error: fmt.Sprintf("input line longer than %d bytes", maxTokenizeLine)}
		} else {
			res = tokenizeOne(chat, line)
		}
		if err := enc.Encode(res); err != nil {
			return fmt.Errorf("tokenize: write: %w", err)
		}
		if err := out.Flush(); err != nil {
			return fmt.Errorf("tokenize: write: %w", err)
		}
		if errors.Is(readErr, io.EOF) {
			return nil
		}
	}
}

// readLine returns the next line without its line ending. A line over the
// limit is consumed whole and reported with tooLong.
func readLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		part, err := r.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(part) > maxTokenizeLine {
				tooLong, line = true, nil
			} else {
				line = append(line, part...)
			}
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return bytes.TrimRight(line, "\r\n"), tooLong, err
		}
	}
}

// tokenizeOne answers one input line.
func tokenizeOne(chat *tokenizer.Chat, line []byte) any {
	if len(bytes.TrimSpace(line)) == 0 {
		return errorResult{Error: "empty line: want a JSON object"}
	}
	var probe tokenizeLine
	if err := json.Unmarshal(line, &probe); err != nil {
		return errorResult{Error: "invalid JSON: " + err.Error()}
	}
	if probe.Messages != nil {
		req, err := tokenizer.ParseChatRequest(line)
		if err != nil {
			return errorResult{Error: err.Error()}
		}
		text, err := chat.ApplyChatTemplate(req)
		if err != nil {
			return errorResult{Error: err.Error()}
		}
		return chatResult{Text: text, IDs: nonNil(chat.EncodePrompt(text))}
	}
	if probe.Text == nil {
		return errorResult{Error: `want {"text": ...} or an OpenAI chat body with "messages"`}
	}
	add := probe.AddSpecialTokens == nil || *probe.AddSpecialTokens
	return idsResult{IDs: nonNil(chat.Tokenizer().Encode(*probe.Text, add))}
}

// nonNil makes empty results print as [] rather than null.
func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}
