package main

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/tokenizer"
)

// parseTokenizers turns serve's --tokenizer ("MODEL=DIR") and
// --chat-template ("MODEL=FILE") values into the library's typed map. A
// template for a model without a tokenizer is an error, as is one model
// given two folders.
func parseTokenizers(specs, templates []string) (map[string]tokenizer.ModelSource, error) {
	out := make(map[string]tokenizer.ModelSource, len(specs))
	for _, spec := range specs {
		model, dir, ok := strings.Cut(spec, "=")
		if !ok || model == "" || dir == "" {
			return nil, fmt.Errorf("tokenizer %q: want MODEL=DIR (a bare folder is `kvroute tokenize`'s form)", spec)
		}
		if old, dup := out[model]; dup && old.Dir != dir {
			return nil, fmt.Errorf("tokenizer for %s: given twice (%s and %s)", model, old.Dir, dir)
		}
		out[model] = tokenizer.ModelSource{Dir: dir}
	}
	for _, t := range templates {
		model, file, ok := strings.Cut(t, "=")
		if !ok || model == "" || file == "" {
			return nil, fmt.Errorf("chat template %q: want MODEL=FILE", t)
		}
		src, known := out[model]
		if !known {
			return nil, fmt.Errorf("chat template for %q: no --tokenizer names that model", model)
		}
		src.ChatTemplate = file
		out[model] = src
	}
	return out, nil
}
