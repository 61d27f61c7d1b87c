package main

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/tokenizer"
)

// The prompt kvbench up suggests must span several KV blocks, or its second
// run can never be a cache hit (a prompt shorter than a block never is).
func TestUpPromptSpansSeveralBlocks(t *testing.T) {
	tok, err := tokenizer.Load("../../" + upTokenizer)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tok.Encode(upPrompt, false)); n < 4*sim.DefaultBlockSize {
		t.Errorf("the prompt is %d Qwen3 tokens, want at least 4 blocks of %d", n, sim.DefaultBlockSize)
	} else {
		t.Logf("%d Qwen3 tokens", n)
	}
	if n := len(upPrompt); n < 4*sim.DefaultBlockSize {
		t.Errorf("the prompt is %d bytes, want 4 blocks even at one token per byte", n)
	}
}

func TestUpCurlSaysWhatToLookFor(t *testing.T) {
	for _, routed := range []bool{true, false} {
		out := upCurl("http://127.0.0.1:1", "http://127.0.0.1:2", routed)
		for _, want := range []string{"curl -si http://127.0.0.1:1/v1/chat/completions", "x-kvroute-worker", "/debug/requests", "/debug/workers"} {
			if !strings.Contains(out, want) {
				t.Errorf("routed=%v: %q missing from\n%s", routed, want, out)
			}
		}
		if routed != strings.Contains(out, "cached_tokens") {
			t.Errorf("routed=%v: cached_tokens promised wrongly:\n%s", routed, out)
		}
		// The body must survive the shell's single quotes.
		curl, _, _ := strings.Cut(out[strings.Index(out, "curl -si"):], "\n")
		if strings.Count(curl, "'") != 4 {
			t.Errorf("routed=%v: quotes in the curl line are unbalanced or nested:\n%s", routed, out)
		}
	}
}
