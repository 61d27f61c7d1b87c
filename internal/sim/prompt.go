package sim

import (
	"encoding/json"
	"fmt"
	"strings"
)

// PromptEncoder turns request text into the token ids vLLM would compute:
// chat bodies rendered with the model's chat template (generation prompt
// added) and encoded without special tokens; completions text encoded with
// special tokens. Implementations must be safe for concurrent use.
type PromptEncoder interface {
	// EncodeChat returns the prompt ids of an OpenAI chat completions body.
	EncodeChat(body []byte) ([]uint32, error)
	// EncodeCompletion returns the prompt ids of completions text.
	EncodeCompletion(text string) ([]uint32, error)
}

// ByteEncoder is the encoder used when no tokenizer is configured: one
// token per UTF-8 byte (id = byte + 3). Chat messages are joined as
// "role: content\n" lines. It keeps kvsim usable without tokenizer files, but
// a router with a real tokenizer computes different blocks; use it only
// with token-id prompts or a router configured the same way.
type ByteEncoder struct{}

var _ PromptEncoder = ByteEncoder{}

// EncodeChat encodes the messages' roles and text contents.
func (ByteEncoder) EncodeChat(body []byte) ([]uint32, error) {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("%w: chat body: %w", errBadRequest, err)
	}
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("%w: messages is empty", errBadRequest)
	}
	var b strings.Builder
	for _, m := range req.Messages {
		b.WriteString(m.Role)
		b.WriteString(": ")
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			b.WriteString(s)
		} else {
			b.Write(m.Content)
		}
		b.WriteByte('\n')
	}
	b.WriteString("assistant: ")
	return bytesToIDs(b.String()), nil
}

// EncodeCompletion encodes text byte by byte.
func (ByteEncoder) EncodeCompletion(text string) ([]uint32, error) {
	return bytesToIDs(text), nil
}

func bytesToIDs(s string) []uint32 {
	ids := make([]uint32, len(s))
	for i := 0; i < len(s); i++ {
		ids[i] = uint32(s[i]) + 3
	}
	return ids
}
