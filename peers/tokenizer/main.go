// Command tokenizer measures kvroute's tokenizer on the corpus it shares
// with the native peers (Hugging Face tokenizers, tiktoken) that peers.py
// measures, per CPU-second on one core. `make bench-tokenizer-peers` runs
// both in interleaved rounds; see docs/tokenizer-peers.md.
//
//	tokenizer -mode prepare -dir D   writes D/corpus.json, the text every side encodes
//	tokenizer -mode ids -dir D       writes D/ids-kvroute-<model>.json for the exactness check
//	tokenizer -mode bench -dir D     prints one JSON result per model and case
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/tokenizer"
)

func main() {
	mode := flag.String("mode", "bench", "prepare, ids or bench")
	dir := flag.String("dir", "", "the directory shared with peers.py (corpus.json, ids)")
	source := flag.String("corpus", "tokenizer/testdata/corpus.txt", "the source text (prepare)")
	testdata := flag.String("testdata", "tokenizer/testdata", "the folder holding <model>/tokenizer.json")
	models := flag.String("models", "llama3,qwen3,deepseek_v3", "comma-separated models")
	minCPU := flag.Duration("min-cpu", 300*time.Millisecond, "CPU time each case runs for at least (bench)")
	procs := flag.Int("procs", 1, "GOMAXPROCS: 1 measures one core")
	flag.Parse()
	runtime.GOMAXPROCS(*procs)
	if err := run(*mode, *dir, *source, *testdata, strings.Split(*models, ","), *minCPU); err != nil {
		fmt.Fprintln(os.Stderr, "tokenizer:", err)
		os.Exit(1)
	}
}

func run(mode, dir, source, testdata string, models []string, minCPU time.Duration) error {
	if dir == "" {
		return fmt.Errorf("-dir is required")
	}
	if mode == "prepare" {
		c, err := buildCorpus(source, models)
		if err != nil {
			return err
		}
		return writeCorpus(dir, c)
	}
	var c corpus
	data, err := os.ReadFile(filepath.Join(dir, "corpus.json"))
	if err != nil {
		return fmt.Errorf("read corpus (run -mode prepare first): %w", err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("corpus.json: %w", err)
	}
	out := json.NewEncoder(os.Stdout)
	for _, m := range models {
		tok, err := tokenizer.Load(filepath.Join(testdata, m))
		if err != nil {
			return err
		}
		switch mode {
		case "ids":
			if err := writeIDs(filepath.Join(dir, "ids-kvroute-"+m+".json"), tok, c, m); err != nil {
				return err
			}
		case "bench":
			for _, bc := range cases(tok, c, m) {
				ops, cpu, wall := measure(bc, minCPU)
				r := result{Side: "kvroute", Model: m, Case: bc.name, Bytes: int64(bc.bytes) * int64(ops),
					Ops: ops, CPU: cpu.Seconds(), Wall: wall.Seconds()}
				if err := out.Encode(r); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("unknown -mode %q", mode)
		}
	}
	return nil
}

// idsFile holds one side's ids of the corpus for one model.
type idsFile struct {
	Whole []uint32   `json:"whole"`
	Docs  [][]uint32 `json:"docs"`
	Chat  []uint32   `json:"chat"`
}

// writeIDs writes kvroute's ids of the corpus; the chat text goes through
// the prefix cache twice (cold, then every chunk a hit), and both must give
// Encode's ids.
func writeIDs(path string, tok *tokenizer.Tokenizer, c corpus, model string) error {
	f := idsFile{Whole: tok.Encode(c.whole(), false), Chat: tok.Encode(c.Chat[model], false)}
	for _, d := range c.Docs {
		f.Docs = append(f.Docs, tok.Encode(d, false))
	}
	prefix := tokenizer.NewPrefixCache(tok, 256<<20)
	for range 2 {
		if ids := prefix.Encode(c.Chat[model]); !slices.Equal(ids, f.Chat) {
			return fmt.Errorf("%s: the prefix cache's ids of the chat text differ from Encode's", model)
		}
	}
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
