package picker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/kvroute/kvroute/multimodal"
	"github.com/kvroute/kvroute/tokenizer"
)

// MultimodalModel declares a served model (or base model) as a
// vision-language model whose images the router places in the prompt.
type MultimodalModel struct {
	// Processor sizes its images (multimodal.DefaultProcessor of its family).
	Processor multimodal.Processor
	// InjectUUID adds each image's derived identity to the request body as
	// the part's "uuid", so that the engine keys its cache blocks by the
	// same identifier the router hashes (--mm-inject-uuid). Without it,
	// images without a client uuid still route, but the engine hashes
	// them its own way and events never match the router's prediction.
	InjectUUID bool
}

// mmSpecs caches one multimodal.Spec per tokenizer and processor.
type mmSpecs struct {
	mu    sync.Mutex
	specs map[mmSpecKey]mmSpecVal
}

type mmSpecKey struct {
	chat *tokenizer.Chat
	proc multimodal.Processor
}

type mmSpecVal struct {
	spec multimodal.Spec
	err  error
}

func (m *mmSpecs) get(chat *tokenizer.Chat, proc multimodal.Processor) (multimodal.Spec, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := mmSpecKey{chat, proc}
	if v, ok := m.specs[k]; ok {
		return v.spec, v.err
	}
	if m.specs == nil {
		m.specs = map[mmSpecKey]mmSpecVal{}
	}
	spec, err := multimodal.NewSpec(proc, chat.Tokenizer())
	m.specs[k] = mmSpecVal{spec, err}
	return spec, err
}

// multimodalModel returns the declaration for the request's model or its
// base model.
func (p *Picker) multimodalModel(models ...string) (MultimodalModel, bool) {
	for _, m := range models {
		if mm, ok := p.cfg.Multimodal[m]; ok && m != "" {
			return mm, true
		}
	}
	return MultimodalModel{}, false
}

// injectUUIDs returns body with "uuid": id added to every image_url part
// whose item has a derived identity, or nil when nothing is added. The
// rest of the body is kept byte for byte: the key goes right after the
// part's opening brace. Parts that already have a "uuid" key (even null)
// are left alone.
func injectUUIDs(body []byte, items []multimodal.Item) ([]byte, error) {
	braces, err := imagePartBraces(body)
	if err != nil {
		return nil, err
	}
	if len(braces) != len(items) {
		return nil, fmt.Errorf("picker: %d image parts in the body, %d images", len(braces), len(items))
	}
	var out []byte
	last := 0
	for i, b := range braces {
		if !items[i].Derived || b.hasUUID {
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(body)+len(braces)*80)
		}
		out = append(out, body[last:b.after]...)
		out = append(out, `"uuid":`...)
		q, err := json.Marshal(items[i].ID)
		if err != nil {
			return nil, err
		}
		out = append(out, q...)
		if !b.empty {
			out = append(out, ',')
		}
		last = b.after
	}
	if out == nil {
		return nil, nil
	}
	return append(out, body[last:]...), nil
}

type partBrace struct {
	after   int  // offset just past the part's '{'
	empty   bool // the object has no keys
	hasUUID bool
}

// imagePartBraces walks body (a chat completions request) and lists the
// image_url content parts of its messages in order, as tokenizer's
// ChatRequestFromObject reads them.
func imagePartBraces(body []byte) ([]partBrace, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out []partBrace
	if err := expectDelim(dec, '{'); err != nil {
		return nil, err
	}
	for dec.More() {
		key, err := keyOf(dec)
		if err != nil {
			return nil, err
		}
		if key != "messages" {
			if err := skipValue(dec); err != nil {
				return nil, err
			}
			continue
		}
		if out, err = messagesParts(dec, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func messagesParts(dec *json.Decoder, out []partBrace) ([]partBrace, error) {
	err := eachObject(dec, func() error {
		for dec.More() {
			key, err := keyOf(dec)
			if err != nil {
				return err
			}
			if key != "content" {
				if err := skipValue(dec); err != nil {
					return err
				}
				continue
			}
			if out, err = contentParts(dec, out); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

func contentParts(dec *json.Decoder, out []partBrace) ([]partBrace, error) {
	err := eachObject(dec, func() error {
		b := partBrace{after: int(dec.InputOffset()), empty: !dec.More()}
		isImage := false
		for dec.More() {
			key, err := keyOf(dec)
			if err != nil {
				return err
			}
			switch key {
			case "type":
				v, err := dec.Token()
				if err != nil {
					return err
				}
				if s, ok := v.(string); ok && s == "image_url" {
					isImage = true
				} else if err := skipRest(dec, v); err != nil {
					return err
				}
				continue
			case "uuid":
				b.hasUUID = true
			}
			if err := skipValue(dec); err != nil {
				return err
			}
		}
		if isImage {
			out = append(out, b)
		}
		return nil
	})
	return out, err
}

// eachObject walks the array that is the decoder's next value: for each
// element that is an object it calls fn just after the element's '{' (fn
// reads the members) and then consumes the closing '}'. A value that is
// not an array, and elements that are not objects, are skipped.
func eachObject(dec *json.Decoder, fn func() error) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != json.Delim('[') {
		return skipRest(dec, tok)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if tok != json.Delim('{') {
			if err := skipRest(dec, tok); err != nil {
				return err
			}
			continue
		}
		if err := fn(); err != nil {
			return err
		}
		if _, err := dec.Token(); err != nil { // '}'
			return err
		}
	}
	_, err = dec.Token() // ']'
	return err
}

func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("picker: want %v, got %v", d, tok)
	}
	return nil
}

func keyOf(dec *json.Decoder) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", err
	}
	k, ok := tok.(string)
	if !ok {
		return "", errors.New("picker: object key is not a string")
	}
	return k, nil
}

// skipValue skips the next value.
func skipValue(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	return skipRest(dec, tok)
}

// skipRest skips the rest of a value whose first token was tok.
func skipRest(dec *json.Decoder, tok json.Token) error {
	d, ok := tok.(json.Delim)
	if !ok || d == '}' || d == ']' {
		return nil
	}
	depth := 1
	for depth > 0 {
		t, err := dec.Token()
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
		if d, ok := t.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
	return nil
}
