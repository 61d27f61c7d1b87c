package multimodal

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	_ "image/gif"  // GIF headers
	_ "image/jpeg" // JPEG headers
	_ "image/png"  // PNG headers

	_ "golang.org/x/image/webp" // WebP headers
)

// ErrImage wraps every error about an image whose size cannot be read.
var ErrImage = errors.New("unreadable image")

// MaxSide bounds what Size accepts, far above any processor's max pixels.
const MaxSide = 1 << 16

// Size reads an image's width and height from its header only
// (image.DecodeConfig: PNG, JPEG, GIF, WebP); pixels are never decoded.
func Size(data []byte) (w, h int, err error) {
	cfg, _, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrImage, err)
	}
	if cfg.Width < 1 || cfg.Height < 1 || cfg.Width > MaxSide || cfg.Height > MaxSide {
		return 0, 0, fmt.Errorf("%w: size %d×%d", ErrImage, cfg.Width, cfg.Height)
	}
	return cfg.Width, cfg.Height, nil
}
