package sim

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/multimodal"
	"github.com/kvroute/kvroute/tokenizer"
)

// ChatEncoder tokenizes exactly as vLLM does with kvroute's tokenizer
// package: chat bodies are rendered with the model's chat template and
// encoded without special tokens; completions text is encoded with them.
type ChatEncoder struct {
	Chat *tokenizer.Chat
	// MM, when set, makes the model a vision-language model: chat image
	// parts are expanded to the processor's tokens and placed
	// (EncodeChatMM), as vLLM's multimodal processor does.
	MM *multimodal.Spec
}

// MMEncoder is a PromptEncoder that also places a chat's images.
type MMEncoder interface {
	EncodeChatMM(body []byte) ([]uint32, []kvindex.MMPlacement, error)
}

var _ MMEncoder = (*ChatEncoder)(nil)

// SetMultimodal declares the encoder's model a vision-language model of
// family's default processor.
func (e *ChatEncoder) SetMultimodal(family multimodal.Family) error {
	spec, err := multimodal.NewSpec(multimodal.DefaultProcessor(family), e.Chat.Tokenizer())
	if err != nil {
		return err
	}
	e.MM = &spec
	return nil
}

// EncodeChatMM is EncodeChat for a chat that may carry images: with MM set,
// each image part is expanded and placed, identified by its uuid when the
// body gives one (as vLLM ≥ 0.10.2 does), else by a content hash of its
// own.
// A remote image of unknown size is refused: the simulator fetches nothing.
func (e *ChatEncoder) EncodeChatMM(body []byte) ([]uint32, []kvindex.MMPlacement, error) {
	req, err := tokenizer.ParseChatRequest(body)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	if e.MM == nil || !multimodal.HasImages(&req) {
		ids, err := e.EncodeChat(body)
		return ids, nil, err
	}
	enc, err := multimodal.EncodeChat(e.Chat, *e.MM, req, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	if enc.Cut {
		return nil, nil, fmt.Errorf("%w: the simulator does not fetch remote images", errBadRequest)
	}
	// Like vLLM, an image without a client uuid is identified by a hash of
	// its content that is not the router's derivation (vLLM hashes the
	// decoded pixels with blake3): only an injected uuid makes the engine's
	// keys the router's.
	for i := range enc.Placements {
		if i < len(enc.Items) && enc.Items[i].Derived {
			enc.Placements[i].ID = "kvsim-content:" + enc.Placements[i].ID
		}
	}
	return enc.Tokens, enc.Placements, nil
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
		return nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	ids, err := e.Chat.EncodeChat(req)
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return nil, fmt.Errorf("%w: %w", errBadRequest, err)
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
