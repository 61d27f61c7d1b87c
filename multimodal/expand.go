package multimodal

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/kvindex"
)

// Token strings of the families' placeholders.
const (
	QwenVisionStart = "<|vision_start|>"
	QwenImagePad    = "<|image_pad|>"
	QwenVisionEnd   = "<|vision_end|>"
	GemmaBOI        = "<start_of_image>"
	GemmaEOI        = "<end_of_image>"
	GemmaSoftToken  = "<image_soft_token>"
)

// Vocab is what Spec needs from a tokenizer.
type Vocab interface {
	TokenID(s string) (uint32, bool)
}

// Spec is one model's image placeholder expansion: its processor and the
// ids of its placeholder tokens.
type Spec struct {
	Proc Processor
	pad  uint32 // Qwen: <|image_pad|>; Gemma: <image_soft_token>
	boi  uint32 // Gemma: <start_of_image>
	eoi  uint32 // Gemma: <end_of_image>
}

// NewSpec looks up the family's placeholder tokens in vocab.
func NewSpec(proc Processor, vocab Vocab) (Spec, error) {
	s := Spec{Proc: proc}
	need := func(tok string) (uint32, error) {
		id, ok := vocab.TokenID(tok)
		if !ok {
			return 0, fmt.Errorf("multimodal: the %s tokenizer has no %s token", proc.Family, tok)
		}
		return id, nil
	}
	var err error
	switch proc.Family {
	case FamilyQwen2VL, FamilyQwen3VL:
		s.pad, err = need(QwenImagePad)
	case FamilyGemma3:
		if s.pad, err = need(GemmaSoftToken); err == nil {
			if s.boi, err = need(GemmaBOI); err == nil {
				s.eoi, err = need(GemmaEOI)
			}
		}
	default:
		err = errors.New("multimodal: no family")
	}
	return s, err
}

// ExpandsText reports whether the family expands its placeholders in the
// prompt text before tokenization (Gemma 3, as its Hugging Face processor
// does, so that the newlines around the image merge with their neighbours
// as the tokenizer merges them); otherwise ExpandTokens works on ids.
func (s Spec) ExpandsText() bool { return s.Proc.Family == FamilyGemma3 }

// gemmaImageText is Gemma3Processor's full_image_sequence.
func gemmaImageText(n int) string {
	return "\n\n" + GemmaBOI + strings.Repeat(GemmaSoftToken, n) + GemmaEOI + "\n\n"
}

// ExpandText replaces each <start_of_image> of a rendered Gemma 3 prompt
// with the processor's full image sequence, as transformers'
// Gemma3Processor does (text.replace(boi_token, full_image_sequence)).
func (s Spec) ExpandText(text string) string {
	if !s.ExpandsText() {
		return text
	}
	return strings.ReplaceAll(text, GemmaBOI, gemmaImageText(s.Proc.Fixed))
}

// Image is one image to place: its identity and, when known, its size.
type Image struct {
	ID string
	// W and H are the size in pixels; 0 means unknown (a remote image not
	// fetched).
	W, H int
}

// ErrUnplaced says the prompt has fewer image placeholders than images.
var ErrUnplaced = errors.New("multimodal: fewer image placeholders in the prompt than images")

// ExpandTokens places images in tokens, the prompt as tokenized from the
// rendered (and, for Gemma 3, text-expanded) template, appending the
// result to dst:
//
//   - Qwen: the k-th <|image_pad|> becomes ImageTokens(w, h) pads, as
//     Qwen2VLProcessor does; the placement is that run of pads, the range
//     vLLM's prompt update gives the item (vision start and end are outside
//     it). An image of unknown size cuts the prompt just before its pad:
//     the router matches up to there and routes by load beyond.
//   - Gemma 3: tokens already hold the full sequences; the placement of the
//     k-th runs from the token before <start_of_image> (the leading
//     newlines) through the token after <end_of_image> (the trailing ones).
//
// cut reports whether the prompt was cut at an image of unknown size.
func (s Spec) ExpandTokens(dst, tokens []uint32, images []Image) (out []uint32, placed []kvindex.MMPlacement, cut bool, err error) {
	if s.ExpandsText() {
		return s.placeGemma(dst, tokens, images)
	}
	k := 0
	out = dst
	for _, t := range tokens {
		if t != s.pad || k >= len(images) {
			out = append(out, t)
			continue
		}
		img := images[k]
		k++
		if img.W <= 0 || img.H <= 0 {
			return out, placed, true, nil
		}
		n, err := s.Proc.ImageTokens(img.W, img.H)
		if err != nil {
			return nil, nil, false, fmt.Errorf("image %d (%d×%d): %w", k-1, img.W, img.H, err)
		}
		placed = append(placed, kvindex.MMPlacement{ID: img.ID, Offset: len(out) - len(dst), Length: n})
		for j := 0; j < n; j++ {
			out = append(out, s.pad)
		}
	}
	if k < len(images) {
		return nil, nil, false, ErrUnplaced
	}
	return out, placed, false, nil
}

func (s Spec) placeGemma(dst, tokens []uint32, images []Image) ([]uint32, []kvindex.MMPlacement, bool, error) {
	out := append(dst, tokens...)
	var placed []kvindex.MMPlacement
	k := 0
	for i := 0; i < len(tokens); i++ {
		if tokens[i] != s.boi {
			continue
		}
		end := i + 1
		for end < len(tokens) && tokens[end] != s.eoi {
			end++
		}
		if end == len(tokens) {
			return nil, nil, false, fmt.Errorf("multimodal: %s without %s", GemmaBOI, GemmaEOI)
		}
		if k >= len(images) {
			return nil, nil, false, errors.New("multimodal: more image placeholders in the prompt than images")
		}
		start, stop := max(i-1, 0), min(end+2, len(tokens))
		placed = append(placed, kvindex.MMPlacement{ID: images[k].ID, Offset: start, Length: stop - start})
		k++
		i = end
	}
	if k < len(images) {
		return nil, nil, false, ErrUnplaced
	}
	return out, placed, false, nil
}
