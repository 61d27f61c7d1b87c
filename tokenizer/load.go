package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// fileJSON is the part of tokenizer.json this package reads.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	Model         json.RawMessage  `json:"model"`
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

// typed reads only the "type" field of a component.
type typed struct {
	Type string `json:"type"`
}

// isNull reports whether a raw component is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// componentType returns the "type" of a component object.
func componentType(raw json.RawMessage) (string, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", err
	}
	return t.Type, nil
}

// Parse builds a Tokenizer from the bytes of a tokenizer.json file.
func Parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode tokenizer.json: %w", err)
	}
	if isNull(f.Model) {
		return nil, errors.New("tokenizer.json has no model")
	}
	t := &Tokenizer{}
	var err error
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
	if t.model, err = parseModel(f.Model, byteLevel); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if !t.model.byteMode && byteLevel {
		// The model cannot run on raw bytes, so the ByteLevel step must map
		// bytes to its printable alphabet as the reference does.
		setByteLevelMapping(t.pre)
	}
	if t.added, err = newAddedVocab(f.AddedTokens, t.normalizer); err != nil {
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
