package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// fileJSON is the part of tokenizer.json this package reads.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// patternJSON is a Split/Replace pattern: {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// isNull reports whether a raw component is absent or JSON null.
// parseSequence parses the members of a Sequence component with parse,
// drops members that parse to nothing (a no-op component), and collapses
// the result: no member is nothing, one member is that member, and more
// are whole(members).
func parseSequence[E comparable, S ~[]E](raws []json.RawMessage, parse func(json.RawMessage) (E, error), whole func(S) E) (E, error) {
	var zero E
	var seq S
	for i, r := range raws {
		e, err := parse(r)
		if err != nil {
			return zero, fmt.Errorf("Sequence[%d]: %w", i, err)
		}
		if e != zero {
			seq = append(seq, e)
		}
	}
	switch len(seq) {
	case 0:
		return zero, nil
	case 1:
		return seq[0], nil
	}
	return whole(seq), nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// readFile splits tokenizer.json into its members, reading the model's vocab
// and merges with the fast scanner and everything else as raw JSON.
func readFile(data []byte) (fileJSON, bpeJSON, error) {
	var f fileJSON
	var m bpeJSON
	sc := &jsonScanner{data: data}
	var modelRest []byte
	err := sc.object(func(key string) error {
		if key == "model" {
			return sc.object(func(mk string) error {
				var err error
				switch mk {
				case "vocab":
					if sc.peek() == '{' {
						m.Vocab, err = sc.vocab()
						return err
					}
				case "merges":
					if sc.peek() == '[' {
						m.Merges, err = sc.merges()
						return err
					}
				}
				raw, err := sc.skip()
				if err != nil {
					return err
				}
				if len(modelRest) > 0 {
					modelRest = append(modelRest, ',')
				}
				modelRest = strconv.AppendQuote(append(modelRest, ""...), mk)
				modelRest = append(append(modelRest, ':'), raw...)
				return nil
			})
		}
		raw, err := sc.skip()
		if err != nil {
			return err
		}
		switch key {
		case "added_tokens":
			return json.Unmarshal(raw, &f.AddedTokens)
		case "normalizer":
			f.Normalizer = raw
		case "pre_tokenizer":
			f.PreTokenizer = raw
		case "post_processor":
			f.PostProcessor = raw
		case "decoder":
			f.Decoder = raw
		}
		return nil
	})
	if err != nil {
		return f, m, err
	}
	if sc.peek() != 0 {
		return f, m, sc.errorf("data after the top-level object")
	}
	if modelRest == nil && m.Vocab == nil {
		return f, m, errors.New("tokenizer.json has no model")
	}
	vocab, merges := m.Vocab, m.Merges
	if err := json.Unmarshal(append(append([]byte{'{'}, modelRest...), '}'), &m); err != nil {
		return f, m, fmt.Errorf("model: %w", err)
	}
	m.Vocab, m.Merges = vocab, merges
	return f, m, nil
}

// Parse builds a Tokenizer from the bytes of a tokenizer.json file.
func Parse(data []byte) (*Tokenizer, error) {
	f, mj, err := readFile(data)
	if err != nil {
		return nil, fmt.Errorf("decode tokenizer.json: %w", err)
	}
	t := &Tokenizer{}
	if !isNull(f.Normalizer) {
		if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
			return nil, fmt.Errorf("normalizer: %w", err)
		}
	}
	byteLevel := false
	if !isNull(f.PreTokenizer) {
		if t.pre, byteLevel, err = parsePreTokenizerChain(f.PreTokenizer); err != nil {
			return nil, fmt.Errorf("pre_tokenizer: %w", err)
		}
	}
	if t.model, err = parseModel(mj, byteLevel); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if !t.model.byteMode && byteLevel {
		// The model cannot run on raw bytes, so the ByteLevel step must map
		// bytes to its printable alphabet as the reference does.
		setByteLevelMapping(t.pre)
	}
	t.pre = t.pre.withoutIdentity()
	if t.added, err = newAddedVocab(f.AddedTokens, t.normalizer, t.model); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	if !isNull(f.PostProcessor) {
		if t.post, err = parsePostProcessor(f.PostProcessor, t); err != nil {
			return nil, fmt.Errorf("post_processor: %w", err)
		}
	}
	if !isNull(f.Decoder) {
		if t.decoder, err = parseDecoder(f.Decoder); err != nil {
			return nil, fmt.Errorf("decoder: %w", err)
		}
	}
	return t, nil
}
