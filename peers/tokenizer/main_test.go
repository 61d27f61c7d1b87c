package main

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

const (
	source   = "../../tokenizer/testdata/corpus.txt"
	testdata = "../../tokenizer/testdata"
)

func TestCutDocsJoinsBack(t *testing.T) {
	c, err := buildCorpus(source, []string{"llama3"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Docs) < 100 {
		t.Fatalf("%d documents, want the corpus cut into about 2 KB ones", len(c.Docs))
	}
	for i, d := range c.Docs[:len(c.Docs)-1] {
		if len(d) < docBytes || !strings.HasSuffix(d, "\n") {
			t.Fatalf("document %d: %d bytes, ends %q", i, len(d), d[len(d)-1:])
		}
	}
	whole, _ := buildCorpus(source, nil)
	if c.whole() != whole.whole() || strings.Count(c.Chat["llama3"], turnEnd["llama3"]) != len(c.Docs) {
		t.Fatal("the documents do not join back into the corpus, or the chat text misses turns")
	}
}

// TestCasesAgree checks that every case of a model produces the ids count
// of a plain Encode, so the benchmark measures the same work on each path.
func TestCasesAgree(t *testing.T) {
	c, err := buildCorpus(source, []string{"qwen3"})
	if err != nil {
		t.Fatal(err)
	}
	c.Docs = c.Docs[:20]
	c.Chat["qwen3"] = strings.Join(c.Docs, turnEnd["qwen3"]) + turnEnd["qwen3"]
	tok, err := tokenizer.Load(filepath.Join(testdata, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"whole": len(tok.Encode(c.whole(), false)),
		"chat":  len(tok.Encode(c.Chat["qwen3"], false)),
	}
	for _, d := range c.Docs {
		want["docs"] += len(tok.Encode(d, false))
	}
	for _, bc := range cases(tok, c, "qwen3") {
		text, _, _ := strings.Cut(bc.name, "/")
		if got := bc.op(); got != want[text] {
			t.Errorf("%s: %d ids, want %d", bc.name, got, want[text])
		}
	}
}

// BenchmarkPeerCorpus runs kvroute's cases of the peer comparison on one
// core, reporting MB per CPU-second ("cpu-MB/s") beside the usual MB/s.
func BenchmarkPeerCorpus(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	models := []string{"llama3", "qwen3", "deepseek_v3"}
	c, err := buildCorpus(source, models)
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range models {
		tok, err := tokenizer.Load(filepath.Join(testdata, m))
		if err != nil {
			b.Fatal(err)
		}
		for _, bc := range cases(tok, c, m) {
			b.Run(m+"/"+bc.name, func(b *testing.B) {
				b.SetBytes(int64(bc.bytes))
				cpu := processCPU()
				for b.Loop() {
					bc.op()
				}
				b.ReportMetric(float64(bc.bytes)*float64(b.N)/(processCPU()-cpu).Seconds()/1e6, "cpu-MB/s")
			})
		}
	}
}
