package multimodal

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Item is one image of a request as the router sees it.
type Item struct {
	// ID is the identifier the engine will use for the image: the client's
	// uuid, or the router's derived one (which must then be injected as the
	// part's uuid for the engine to use it).
	ID string
	// Derived is true when ID is the router's own, not the client's.
	Derived bool
	// Data holds the decoded bytes of a data: URL; nil for a remote image.
	Data []byte
	// Remote is true for an image given by address (not fetched).
	Remote bool
}

// ErrDataURL wraps every error about a malformed data: URL.
var ErrDataURL = errors.New("malformed data: URL")

// Identify returns the identity of one image part. vLLM (since 0.10.2)
// takes a media item's "uuid" as its identifier when one is given and no
// processor or tokenization kwargs are set (vllm/multimodal/processing.py,
// _hash_mm_items; vllm-project/vllm commit
// 001cabc1be16a59a70d720ed61a13b678c060a18); without one it hashes the
// decoded pixels (blake3 over its own serialization), which the router
// cannot reproduce without decoding, so the router derives an identity and
// injects it as the uuid: the SHA-256 (lowercase hex) of the decoded bytes
// for a data: URL, or of the URL string for a remote image.
func Identify(rawURL, uuid string) (Item, error) {
	var it Item
	if strings.HasPrefix(rawURL, "data:") {
		data, err := DecodeDataURL(rawURL)
		if err != nil {
			return Item{}, err
		}
		it.Data = data
		if uuid == "" {
			sum := sha256.Sum256(data)
			it.ID, it.Derived = hex.EncodeToString(sum[:]), true
		}
	} else {
		it.Remote = true
		if uuid == "" {
			sum := sha256.Sum256([]byte(rawURL))
			it.ID, it.Derived = hex.EncodeToString(sum[:]), true
		}
	}
	if uuid != "" {
		it.ID = uuid
	}
	return it, nil
}

// DecodeDataURL returns the bytes of a data: URL (RFC 2397):
// data:[<mediatype>][;base64],<data>. Base64 may be padded or not;
// other data is percent-decoded.
func DecodeDataURL(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, "data:")
	if !ok {
		return nil, fmt.Errorf("%w: no data: scheme", ErrDataURL)
	}
	meta, payload, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, fmt.Errorf("%w: no comma", ErrDataURL)
	}
	if strings.HasSuffix(strings.ToLower(meta), ";base64") {
		payload = strings.TrimRight(payload, "=")
		b, err := base64.RawStdEncoding.DecodeString(payload)
		if err != nil {
			if b2, err2 := base64.RawURLEncoding.DecodeString(payload); err2 == nil {
				return b2, nil
			}
			return nil, fmt.Errorf("%w: %w", ErrDataURL, err)
		}
		return b, nil
	}
	p, err := url.PathUnescape(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDataURL, err)
	}
	return []byte(p), nil
}
