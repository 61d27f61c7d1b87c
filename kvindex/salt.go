package kvindex

import "github.com/kvroute/kvroute/kvevents/vllmwire"

// cacheSalt finds the cache_salt in the extra keys of a root BlockStored.
// vLLM builds each block's extra keys as lora name + multimodal keys +
// cache_salt (first block only) + prompt-embedding hashes; multimodal keys
// are tuples and embedding hashes are bytes, so the salt is the first
// string after the optional LoRA name in the first block's tuple.
// It returns "" when there is none or the keys are not in that shape.
func cacheSalt(extraKeys []byte, loraName string) string {
	if len(extraKeys) == 0 {
		return ""
	}
	r := vllmwire.NewReader(extraKeys)
	n, err := r.ArrayLen()
	if err != nil || n == 0 {
		return ""
	}
	if null, err := r.IsNil(); err != nil || null {
		return ""
	}
	m, err := r.ArrayLen()
	if err != nil {
		return ""
	}
	for i := 0; i < m; i++ {
		c, err := r.Peek()
		if err != nil {
			return ""
		}
		if !vllmwire.IsStringCode(c) {
			if r.Skip() != nil {
				return ""
			}
			continue
		}
		s, err := r.Str()
		if err != nil {
			return ""
		}
		if i == 0 && loraName != "" && s == loraName {
			continue
		}
		return s
	}
	return ""
}
