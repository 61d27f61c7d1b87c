package multimodal

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Family is a vision-language model family whose image placeholders the
// router knows how to expand.
type Family uint8

const (
	// FamilyNone is a text-only model.
	FamilyNone Family = iota
	// FamilyQwen2VL is Qwen2-VL and Qwen2.5-VL: the template's
	// <|vision_start|><|image_pad|><|vision_end|> gets one <|image_pad|>
	// per merged patch after smart-resize (patch 14, merge 2).
	FamilyQwen2VL
	// FamilyQwen3VL is Qwen3-VL: as Qwen2.5-VL with patch 16.
	FamilyQwen3VL
	// FamilyGemma3 is Gemma 3: each <start_of_image> becomes
	// "\n\n<start_of_image>" + 256 <image_soft_token> + "<end_of_image>\n\n".
	FamilyGemma3
)

// ParseFamily reads a family name: qwen2-vl, qwen2.5-vl, qwen3-vl, gemma3.
func ParseFamily(s string) (Family, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "qwen2-vl", "qwen2.5-vl", "qwen2_vl", "qwen2_5_vl":
		return FamilyQwen2VL, nil
	case "qwen3-vl", "qwen3_vl":
		return FamilyQwen3VL, nil
	case "gemma3", "gemma-3", "gemma3-vl":
		return FamilyGemma3, nil
	}
	return FamilyNone, fmt.Errorf("unknown multimodal family %q (want qwen2-vl, qwen2.5-vl, qwen3-vl or gemma3)", s)
}

// String names the family as ParseFamily reads it.
func (f Family) String() string {
	switch f {
	case FamilyQwen2VL:
		return "qwen2.5-vl"
	case FamilyQwen3VL:
		return "qwen3-vl"
	case FamilyGemma3:
		return "gemma3"
	}
	return "none"
}

// Processor is an image processor's sizing: patch and merge sizes and the
// pixel bounds of smart-resize (Qwen), or a fixed count (Gemma 3).
type Processor struct {
	Family    Family
	PatchSize int
	MergeSize int
	MinPixels int
	MaxPixels int
	// Fixed is the token count of every image when not 0 (Gemma 3: 256).
	Fixed int
}

// DefaultProcessor returns the defaults of the family's
// preprocessor_config.json: Qwen2.5-VL patch 14, merge 2, min_pixels 3136,
// max_pixels 12845056; Qwen3-VL patch 16, merge 2, shortest_edge 65536,
// longest_edge 16777216 (its "size" pixel bounds); Gemma 3 256 tokens
// (mm_tokens_per_image, pan-and-scan off).
func DefaultProcessor(f Family) Processor {
	switch f {
	case FamilyQwen2VL:
		return Processor{Family: f, PatchSize: 14, MergeSize: 2, MinPixels: 3136, MaxPixels: 12845056}
	case FamilyQwen3VL:
		return Processor{Family: f, PatchSize: 16, MergeSize: 2, MinPixels: 65536, MaxPixels: 16777216}
	case FamilyGemma3:
		return Processor{Family: f, Fixed: 256}
	}
	return Processor{}
}

// ErrAspect is the processor's refusal of an image over 200:1.
var ErrAspect = errors.New("absolute aspect ratio must be smaller than 200")

// ImageTokens returns how many placeholder tokens an image of w×h pixels
// becomes (the pad or soft tokens only, not the start and end markers).
func (p Processor) ImageTokens(w, h int) (int, error) {
	if p.Fixed > 0 {
		return p.Fixed, nil
	}
	if p.PatchSize < 1 || p.MergeSize < 1 {
		return 0, errors.New("multimodal: processor has no patch size")
	}
	factor := p.PatchSize * p.MergeSize
	rh, rw, err := SmartResize(h, w, factor, p.MinPixels, p.MaxPixels)
	if err != nil {
		return 0, err
	}
	return (rh / factor) * (rw / factor), nil
}

// SmartResize is Qwen2-VL's smart_resize (transformers
// models/qwen2_vl/image_processing_qwen2_vl.py): both sides rounded to a
// multiple of factor (Python's round: half to even), then scaled down or up
// to keep the area within [minPixels, maxPixels], keeping the aspect ratio.
func SmartResize(height, width, factor, minPixels, maxPixels int) (int, int, error) {
	if height < 1 || width < 1 || factor < 1 {
		return 0, 0, fmt.Errorf("multimodal: image size %d×%d", width, height)
	}
	if float64(max(height, width))/float64(min(height, width)) > 200 {
		return 0, 0, ErrAspect
	}
	fh, fw, ff := float64(height), float64(width), float64(factor)
	hBar := int(math.RoundToEven(fh/ff)) * factor
	wBar := int(math.RoundToEven(fw/ff)) * factor
	switch {
	case hBar*wBar > maxPixels:
		beta := math.Sqrt(float64(height*width) / float64(maxPixels))
		hBar = max(factor, int(math.Floor(fh/beta/ff))*factor)
		wBar = max(factor, int(math.Floor(fw/beta/ff))*factor)
	case hBar*wBar < minPixels:
		beta := math.Sqrt(float64(minPixels) / float64(height*width))
		hBar = int(math.Ceil(fh*beta/ff)) * factor
		wBar = int(math.Ceil(fw*beta/ff)) * factor
	}
	return hBar, wBar, nil
}
