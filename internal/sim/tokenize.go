package sim

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/tokenizer"
)

// ChatEncoder tokenizes exactly as vLLM does with kvroute's tokenizer
// package: chat bodies are rendered with the model's chat template and
// encoded without special tokens; completions text is encoded with them.
type ChatEncoder struct {
	Chat *tokenizer.Chat
}

var _ PromptEncoder = (*ChatEncoder)(nil)

// LoadChatEncoder loads tokenizer.json and tokenizer_config.json from dir;
// templateFile, when set, overrides the chat template (vLLM's
// --chat-template).
func LoadChatEncoder(dir, templateFile string) (*ChatEncoder, error) {
	c, err := tokenizer.LoadChat(dir, templateFile, tokenizer.ChatOptions{})
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", dir, err)
	}
	return &ChatEncoder{Chat: c}, nil
}

// EncodeChat parses the OpenAI chat body and encodes its rendered prompt.
func (e *ChatEncoder) EncodeChat(body []byte) ([]uint32, error) {
	req, err := tokenizer.ParseChatRequest(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	ids, err := e.Chat.EncodeChat(req)
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return nil, fmt.Errorf("%w: %v", errBadRequest, err)
		}
		return nil, fmt.Errorf("render chat template: %w", err)
	}
	return ids, nil
}

// EncodeCompletion encodes text with special tokens, as vLLM's completions
// endpoint does.
func (e *ChatEncoder) EncodeCompletion(text string) ([]uint32, error) {
	return e.Chat.Tokenizer().Encode(text, true), nil
}
