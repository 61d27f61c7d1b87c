package tokenizer

import (
	"bufio"
	"compress/gzip"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// families are the tokenizer folders under testdata/ with golden vectors.
var families = []string{"llama3", "qwen3", "mistral-sp", "deepseek_v3"}

var (
	loadMu  sync.Mutex
	loaded  = map[string]*Tokenizer{}
	loadErr = map[string]error{}
)

// loadFamily loads testdata/<family> once per test binary: loading takes a
// few hundred milliseconds, far more under the race detector.
func loadFamily(tb testing.TB, family string) *Tokenizer {
	tb.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if t, ok := loaded[family]; ok {
		return t
	}
	if err, ok := loadErr[family]; ok {
		tb.Fatalf("load %s: %v", family, err)
	}
	t, err := Load(filepath.Join("testdata", family))
	if err != nil {
		loadErr[family] = err
		tb.Fatalf("load %s: %v", family, err)
	}
	loaded[family] = t
	return t
}

// goldenCase is one line of testdata/golden/<family>.jsonl.gz.
type goldenCase struct {
	Text             string   `json:"text"`
	AddSpecialTokens bool     `json:"add_special_tokens"`
	Corpus           bool     `json:"corpus"`
	IDs              []uint32 `json:"ids"`
	Decoded          *string  `json:"decoded"`
}

func readGolden(tb testing.TB, family string) []goldenCase {
	tb.Helper()
	return readGoldenFile(tb, filepath.Join("testdata", "golden", family+".jsonl.gz"))
}

func readGoldenFile(tb testing.TB, path string) []goldenCase {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	var out []goldenCase
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		c, err := parseGoldenLine(sc.Bytes())
		if err != nil {
			tb.Fatalf("golden %s: %v", path, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// parseGoldenLine reads one golden line with the package's own JSON scanner
// (encoding/json's reflection is slow under the race detector).
func parseGoldenLine(line []byte) (goldenCase, error) {
	var c goldenCase
	s := &jsonScanner{data: line}
	err := s.object(func(key string) error {
		switch key {
		case "text":
			v, err := s.str()
			c.Text = v
			return err
		case "decoded":
			v, err := s.str()
			c.Decoded = &v
			return err
		case "ids":
			c.IDs = []uint32{}
			return s.array(func() error {
				id, err := s.uint()
				c.IDs = append(c.IDs, id)
				return err
			})
		case "add_special_tokens", "corpus":
			raw, err := s.skip()
			v := string(raw) == "true"
			if key == "corpus" {
				c.Corpus = v
			} else {
				c.AddSpecialTokens = v
			}
			return err
		}
		_, err := s.skip()
		return err
	})
	return c, err
}

func readCorpus(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "corpus.txt"))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
