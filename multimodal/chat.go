package multimodal

import (
	"fmt"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/tokenizer"
)

// Encoded is a chat prompt with its images placed.
type Encoded struct {
	// Tokens are the prompt's token ids as the engine will see them, cut
	// before the first image of unknown size when Cut is set.
	Tokens []uint32
	// Placements are the placed images, in prompt order.
	Placements []kvindex.MMPlacement
	// Items are every image part of the request, in message order, with
	// the identity the engine must use.
	Items []Item
	// Cut reports that the prompt stops before an image whose size is
	// unknown (a remote image that was not fetched).
	Cut bool
}

// HasImages reports whether any message of req has an image part.
func HasImages(req *tokenizer.ChatRequest) bool {
	for i := range req.Messages {
		if len(req.Messages[i].Images) > 0 {
			return true
		}
	}
	return false
}

// EncodeChat renders req with chat's template, expands every image
// placeholder to the processor's token count and places each image,
// appending the tokens to dst. Image sizes come from the headers of data:
// URLs; remote images have no size, and for families whose count depends
// on the size the prompt is cut before the first of them.
func EncodeChat(chat *tokenizer.Chat, spec Spec, req tokenizer.ChatRequest, dst []uint32) (Encoded, error) {
	var enc Encoded
	var images []Image
	for mi := range req.Messages {
		for _, part := range req.Messages[mi].Images {
			it, err := Identify(part.URL, part.UUID)
			if err != nil {
				return Encoded{}, err
			}
			img := Image{ID: it.ID}
			switch {
			case spec.Proc.Fixed > 0:
				img.W, img.H = 1, 1 // the count does not depend on the size
			case !it.Remote:
				if img.W, img.H, err = Size(it.Data); err != nil {
					return Encoded{}, fmt.Errorf("image %d: %w", len(images), err)
				}
			}
			it.Data = nil // not kept past the request
			enc.Items = append(enc.Items, it)
			images = append(images, img)
		}
	}
	text, err := chat.ApplyChatTemplate(req)
	if err != nil {
		return Encoded{}, err
	}
	text = spec.ExpandText(text)
	toks := chat.Tokenizer().Encode(text, false)
	enc.Tokens, enc.Placements, enc.Cut, err = spec.ExpandTokens(dst, toks, images)
	if err != nil {
		return Encoded{}, err
	}
	return enc, nil
}
