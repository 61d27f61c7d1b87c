package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

type preTokenizerJSON struct {
	Type           string            `json:"type"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        patternJSON       `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Replacement    string            `json:"replacement"`
	PrependScheme  string            `json:"prepend_scheme"`
	Split          *bool             `json:"split"`
	Individual     bool              `json:"individual_digits"`
}

// parsePreTokenizerChain flattens the pre-tokenizer into steps. byteLevel
// reports that the chain ends with its only ByteLevel step, so the model may
// run on raw bytes.
func parsePreTokenizerChain(raw json.RawMessage) (*preChain, bool, error) {
	c := &preChain{}
	if err := c.add(raw); err != nil {
		return nil, false, err
	}
	if len(c.steps) == 0 {
		return nil, false, nil
	}
	count := 0
	for _, s := range c.steps {
		if _, ok := s.(*byteLevelStep); ok {
			count++
		}
	}
	if _, isBL := c.steps[len(c.steps)-1].(*byteLevelStep); count == 1 && isBL {
		return c, true, nil
	}
	setByteLevelMapping(c)
	return c, false, nil
}

// setByteLevelMapping makes every ByteLevel step map bytes to the
// byte-level alphabet, for models that cannot run on raw bytes.
func setByteLevelMapping(c *preChain) {
	if c == nil {
		return
	}
	for _, s := range c.steps {
		if bl, ok := s.(*byteLevelStep); ok {
			bl.mapBytes = true
		}
	}
}

// withoutIdentity drops the steps that hand every piece on unchanged: a
// ByteLevel step without regex, prefix space or byte mapping (the usual last
// step of a byte-level model running on raw bytes) would only copy the
// piece list. It returns nil when no step is left.
func (c *preChain) withoutIdentity() *preChain {
	if c == nil {
		return nil
	}
	steps := c.steps[:0:0]
	for _, s := range c.steps {
		if bl, ok := s.(*byteLevelStep); ok && !bl.addPrefixSpace && !bl.useRegex && !bl.mapBytes {
			continue
		}
		steps = append(steps, s)
	}
	if len(steps) == 0 {
		return nil
	}
	return &preChain{steps: steps, isolators: chainIsolators(steps)}
}

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Isolated", "":
		return isolated, nil
	case "Removed":
		return removed, nil
	case "MergedWithPrevious":
		return mergedWithPrevious, nil
	case "MergedWithNext":
		return mergedWithNext, nil
	case "Contiguous":
		return contiguous, nil
	}
	return 0, fmt.Errorf("unsupported split behavior %q", s)
}

func (c *preChain) add(raw json.RawMessage) error {
	var j preTokenizerJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return err
	}
	switch j.Type {
	case "Sequence":
		for i, r := range j.PreTokenizers {
			if err := c.add(r); err != nil {
				return fmt.Errorf("Sequence[%d]: %w", i, err)
			}
		}
	case "Split":
		m, err := parsePattern(j.Pattern)
		if err != nil {
			return fmt.Errorf("Split: %w", err)
		}
		b, err := parseBehavior(j.Behavior)
		if err != nil {
			return fmt.Errorf("Split: %w", err)
		}
		c.steps = append(c.steps, &splitStep{m: m, behavior: b, invert: j.Invert})
	case "ByteLevel":
		c.steps = append(c.steps, &byteLevelStep{
			addPrefixSpace: j.AddPrefixSpace == nil || *j.AddPrefixSpace,
			useRegex:       j.UseRegex == nil || *j.UseRegex,
		})
	case "Metaspace":
		ms, err := parseMetaspace(j.Replacement, j.PrependScheme, j.AddPrefixSpace, j.Split)
		if err != nil {
			return err
		}
		c.steps = append(c.steps, ms)
	case "Digits":
		b := contiguous
		if j.Individual {
			b = isolated
		}
		c.steps = append(c.steps, &charSplitStep{pred: unicode.IsNumber, behavior: b})
	case "Punctuation":
		b, err := parseBehavior(j.Behavior)
		if err != nil {
			return fmt.Errorf("Punctuation: %w", err)
		}
		c.steps = append(c.steps, &charSplitStep{pred: isPunctuation, behavior: b})
	case "Whitespace":
		c.steps = append(c.steps, whitespaceStep{})
	case "WhitespaceSplit":
		c.steps = append(c.steps, &charSplitStep{pred: unicode.IsSpace, behavior: removed})
	case "":
		return errors.New("pre-tokenizer without a type")
	default:
		return fmt.Errorf("unsupported pre-tokenizer %q", j.Type)
	}
	return nil
}

// parseMetaspace reads both the current (prepend_scheme) and the legacy
// (add_prefix_space) forms of Metaspace.
func parseMetaspace(replacement, scheme string, addPrefix, split *bool) (*metaspaceStep, error) {
	if replacement == "" {
		replacement = "▁"
	}
	r, n := utf8.DecodeRuneInString(replacement)
	if n != len(replacement) {
		return nil, fmt.Errorf("Metaspace replacement %q is not one character", replacement)
	}
	switch scheme {
	case "always", "first", "never":
	case "":
		scheme = "always"
		if addPrefix != nil && !*addPrefix {
			scheme = "never"
		}
	default:
		return nil, fmt.Errorf("unsupported Metaspace prepend_scheme %q", scheme)
	}
	return &metaspaceStep{replacement: r, repl: replacement, prepend: scheme, split: split == nil || *split}, nil
}
