package main

import (
	"syscall"
	"time"

	"github.com/kvroute/kvroute/tokenizer"
)

// benchCase is one measured way of encoding part of the corpus.
type benchCase struct {
	name  string // the row it fills: whole/uncached, docs/warm, chat/prefix-hit, ...
	bytes int    // bytes one op encodes
	op    func() int
}

// cases lists kvroute's cases for one model:
//   - uncached: a fresh piece cache at the start of every op (inside the
//     timed op), so the text is seen for the first time and only pieces
//     repeated within it hit; this is the Hugging Face cache cleared per op;
//   - warm: the piece cache kept across ops, as in a long-running router
//     (Hugging Face's word cache is kept the same way);
//   - prefix-hit: the chat text through a warm PrefixCache, every chunk a
//     hit, what the router pays for a conversation it has seen.
//
// Each op returns the number of ids it produced, so no work is skipped.
func cases(tok *tokenizer.Tokenizer, c corpus, model string) []benchCase {
	whole := c.whole()
	chat := c.Chat[model]
	fresh := func() *tokenizer.Tokenizer { return tok.WithPieceCache(tokenizer.DefaultPieceCacheSlots) }
	docs := func(t *tokenizer.Tokenizer) int {
		n := 0
		for _, d := range c.Docs {
			n += len(t.Encode(d, false))
		}
		return n
	}
	warm := fresh()
	prefix := tokenizer.NewPrefixCache(tok.WithPieceCache(tokenizer.DefaultPieceCacheSlots), 256<<20)
	prefix.Encode(chat)
	return []benchCase{
		{"whole/uncached", len(whole), func() int { return len(fresh().Encode(whole, false)) }},
		{"docs/uncached", len(whole), func() int { return docs(fresh()) }},
		{"chat/uncached", len(chat), func() int { return len(fresh().Encode(chat, false)) }},
		{"whole/warm", len(whole), func() int { return len(warm.Encode(whole, false)) }},
		{"docs/warm", len(whole), func() int { return docs(warm) }},
		{"chat/warm", len(chat), func() int { return len(warm.Encode(chat, false)) }},
		{"chat/prefix-hit", len(chat), func() int { return len(prefix.Encode(chat)) }},
	}
}

// result is one case's measurement, in the JSON form the driver reads.
type result struct {
	Side  string  `json:"side"`
	Model string  `json:"model"`
	Case  string  `json:"case"`
	Bytes int64   `json:"bytes"`
	Ops   int     `json:"ops"`
	CPU   float64 `json:"cpu_s"`
	Wall  float64 `json:"wall_s"`
}

// measure runs bc once to warm up, then for at least minCPU of process CPU
// time and at least three ops.
func measure(bc benchCase, minCPU time.Duration) (ops int, cpu, wall time.Duration) {
	bc.op()
	cpu0, wall0 := processCPU(), time.Now()
	for ops < 3 || processCPU()-cpu0 < minCPU {
		if bc.op() == 0 {
			panic("no ids from " + bc.name)
		}
		ops++
	}
	return ops, processCPU() - cpu0, time.Since(wall0)
}

// processCPU is the process's CPU time, user and system, over all threads.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
