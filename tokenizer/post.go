package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
)

// postProcessor adds the special tokens of a single sequence (BOS, EOS, CLS)
// when special tokens are asked for.
type postProcessor interface {
	process(ids []uint32) []uint32
}

var (
	_ postProcessor = (*template)(nil)
	_ postProcessor = postSequence{}
)

// template is TemplateProcessing's "single" template, resolved to ids: a
// nil entry stands for the sequence itself.
type template struct {
	parts [][]uint32
}

func (t *template) process(ids []uint32) []uint32 {
	n := 0
	for _, p := range t.parts {
		if p == nil {
			n += len(ids)
		} else {
			n += len(p)
		}
	}
	out := make([]uint32, 0, n)
	for _, p := range t.parts {
		if p == nil {
			out = append(out, ids...)
		} else {
			out = append(out, p...)
		}
	}
	return out
}

// postSequence runs post-processors in order.
type postSequence []postProcessor

func (s postSequence) process(ids []uint32) []uint32 {
	for _, p := range s {
		ids = p.process(ids)
	}
	return ids
}

type postJSON struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []json.RawMessage `json:"single"`
	SpecialTokens map[string]struct {
		ID  string   `json:"id"`
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
	Sep *[2]json.RawMessage `json:"sep"`
	Cls *[2]json.RawMessage `json:"cls"`
}

type templatePieceJSON struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// parsePostProcessor builds a post-processor; ByteLevel only trims offsets,
// which ids do not carry, so it yields nil.
func parsePostProcessor(raw json.RawMessage, t *Tokenizer) (postProcessor, error) {
	var j postJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "ByteLevel":
		return nil, nil
	case "TemplateProcessing":
		tpl := &template{}
		for i, r := range j.Single {
			var p templatePieceJSON
			if err := json.Unmarshal(r, &p); err != nil {
				return nil, fmt.Errorf("TemplateProcessing single[%d]: %w", i, err)
			}
			switch {
			case p.Sequence != nil:
				if p.Sequence.ID != "A" {
					return nil, fmt.Errorf("TemplateProcessing single[%d]: sequence %q in a single template", i, p.Sequence.ID)
				}
				tpl.parts = append(tpl.parts, nil)
			case p.SpecialToken != nil:
				st, ok := j.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("TemplateProcessing: special token %q is not in special_tokens", p.SpecialToken.ID)
				}
				tpl.parts = append(tpl.parts, append([]uint32{}, st.IDs...))
			default:
				return nil, fmt.Errorf("TemplateProcessing single[%d]: neither SpecialToken nor Sequence", i)
			}
		}
		return tpl, nil
	case "BertProcessing", "RobertaProcessing":
		if j.Cls == nil || j.Sep == nil {
			return nil, fmt.Errorf("%s without cls and sep", j.Type)
		}
		var cls, sep uint32
		if err := json.Unmarshal(j.Cls[1], &cls); err != nil {
			return nil, fmt.Errorf("%s cls: %w", j.Type, err)
		}
		if err := json.Unmarshal(j.Sep[1], &sep); err != nil {
			return nil, fmt.Errorf("%s sep: %w", j.Type, err)
		}
		return &template{parts: [][]uint32{{cls}, nil, {sep}}}, nil
	case "Sequence":
		member := func(r json.RawMessage) (postProcessor, error) { return parsePostProcessor(r, t) }
		return parseSequence(j.Processors, member, func(s postSequence) postProcessor { return s })
	case "":
		return nil, errors.New("post-processor without a type")
	default:
		return nil, fmt.Errorf("unsupported post-processor %q", j.Type)
	}
}
