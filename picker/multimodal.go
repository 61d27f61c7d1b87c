package picker

import (
	"encoding/json"
	"fmt"
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

// imageParts lists the image parts of req's messages, in order: the order
// of multimodal.EncodeChat's items.
func imageParts(req *tokenizer.ChatRequest) []tokenizer.ImagePart {
	var out []tokenizer.ImagePart
	for i := range req.Messages {
		out = append(out, req.Messages[i].Images...)
	}
	return out
}

// injectUUIDs returns body with "uuid": id added to every image part whose
// item has a derived identity, or nil when nothing is added. parts are
// the request's image parts as tokenizer.ParseRequest read them from body
// (each knows where its '{' lies), items their identities, in the same
// order. The rest of the body is kept byte for byte: the key goes right
// after the part's opening brace. Parts that already have a "uuid" key
// (even null) are left alone.
func injectUUIDs(body []byte, parts []tokenizer.ImagePart, items []multimodal.Item) ([]byte, error) {
	if len(parts) != len(items) {
		return nil, fmt.Errorf("picker: %d image parts in the body, %d images", len(parts), len(items))
	}
	var out []byte
	last := 0
	for i, part := range parts {
		if !items[i].Derived || part.HasUUIDKey {
			continue
		}
		// An image part is an object with a "type" key inside the
		// messages, never the body's first byte.
		if part.Offset <= last || part.Offset >= len(body) || body[part.Offset] != '{' {
			return nil, fmt.Errorf("picker: image part %d has no known place in the body (offset %d)", i, part.Offset)
		}
		after := part.Offset + 1
		if out == nil {
			out = make([]byte, 0, len(body)+len(parts)*80)
		}
		out = append(out, body[last:after]...)
		out = append(out, `"uuid":`...)
		q, err := json.Marshal(items[i].ID)
		if err != nil {
			return nil, err
		}
		out = append(out, q...)
		out = append(out, ',') // the part has at least its "type" key
		last = after
	}
	if out == nil {
		return nil, nil
	}
	return append(out, body[last:]...), nil
}
