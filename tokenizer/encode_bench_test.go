package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuClock measures the process's CPU time (user+system) over a benchmark
// loop. On a shared machine wall-clock MB/s swings with other load; MB per
// CPU-second ("cpu-MB/s") is the steadier figure for one core's speed.
type cpuClock struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPUClock() cpuClock { return cpuClock{start: processCPU()} }

func (c cpuClock) report(b *testing.B, bytesPerOp int64) {
	spent := processCPU() - c.start
	if spent > 0 {
		b.ReportMetric(float64(bytesPerOp)*float64(b.N)/spent.Seconds()/1e6, "cpu-MB/s")
	}
}

// uncached returns a copy of tok whose BPE model has no piece cache, so a
// benchmark measures the full pipeline on every piece.
func uncached(tok *Tokenizer) *Tokenizer { return tok.WithPieceCache(0) }

// BenchmarkEncode encodes the mixed prose, code and multilingual corpus in
// one call per iteration, in three modes:
//   - "uncached": the piece cache is emptied at the start of every
//     operation (inside the timed loop), so the corpus is seen for the first
//     time and only pieces repeated within it hit; the hit rate is reported;
//   - "nocache": no piece cache at all, BPE merges on every piece that needs
//     them;
//   - "cached": the cache is warm from a previous pass over the corpus.
//
// None of them uses the chat prefix cache. The target is >= 10 MB/s for
// byte-level BPE uncached on one core (docs/performance.md).
func BenchmarkEncode(b *testing.B) {
	corpus := readCorpus(b)
	for _, fam := range families {
		tok := loadFamily(b, fam)
		cold := tok.WithPieceCache(DefaultPieceCacheSlots)
		for _, mode := range []struct {
			name  string
			tok   *Tokenizer
			reset bool
		}{{"uncached", cold, true}, {"nocache", uncached(tok), false}, {"cached", tok, false}} {
			b.Run(fam+"/"+mode.name, func(b *testing.B) {
				if !mode.reset {
					mode.tok.Encode(corpus, false) // warm the cache when there is one
				}
				b.SetBytes(int64(len(corpus)))
				b.ReportAllocs()
				cpu := startCPUClock()
				for b.Loop() {
					if mode.reset && mode.tok.model.cache != nil {
						mode.tok.model.cache.reset()
					}
					mode.tok.Encode(corpus, false)
				}
				cpu.report(b, int64(len(corpus)))
				if mode.reset {
					// b.Loop clears metrics reported before it.
					if hits, misses := pieceCacheHits(mode.tok, corpus); hits+misses > 0 {
						b.ReportMetric(100*float64(hits)/float64(hits+misses), "piece-hit-%")
					}
				}
			})
		}
	}
}

// pieceCacheHits encodes text once with tok's piece cache emptied first and
// returns how many pieces that needed merges were found in the cache and
// how many were not.
func pieceCacheHits(tok *Tokenizer, text string) (hits, misses int) {
	if tok.model.cache == nil {
		return 0, 0
	}
	tok.model.cache.reset()
	st := &encodeState{}
	tok.encodeInto(st, text, nil)
	return st.cacheHits, st.cacheMisses
}

// BenchmarkPreTokenize is the floor under BenchmarkEncode: the same corpus
// through added-token extraction, normalization and pre-tokenization, with
// no model. Encode's MB/s divided by this one's is the share of the limit
// the model leaves.
func BenchmarkPreTokenize(b *testing.B) {
	corpus := readCorpus(b)
	for _, fam := range families {
		tok := loadFamily(b, fam)
		b.Run(fam, func(b *testing.B) { benchPreTokenize(b, tok, corpus) })
	}
}

// BenchmarkPreTokenizeCJK is BenchmarkPreTokenize on Chinese and Japanese
// text with a few ASCII words and numbers, which the mostly-ASCII corpus
// hardly exercises: DeepSeek-V3's chain walks each CJK rune three times
// (digits, CJK/kana runs, then its main split).
func BenchmarkPreTokenizeCJK(b *testing.B) {
	text := strings.Repeat("我们在2024年发布了新的模型，它的上下文长度是128K。"+
		"今日はとても良い天気ですね、散歩に行きましょう。"+
		"请用Go语言写一个HTTP服务器，并解释每一行代码的作用。\n", 1500)
	for _, fam := range []string{"deepseek_v3", "llama3", "qwen3"} {
		tok := loadFamily(b, fam)
		b.Run(fam, func(b *testing.B) { benchPreTokenize(b, tok, text) })
	}
}

// benchPreTokenize pre-tokenizes text once per iteration and reports
// cpu-MB/s.
func benchPreTokenize(b *testing.B, tok *Tokenizer, text string) {
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	st := getEncodeState()
	defer putEncodeState(st)
	pieces := 0
	cpu := startCPUClock()
	for b.Loop() {
		pieces = preTokenizeOnly(tok, st, text)
	}
	cpu.report(b, int64(len(text)))
	if pieces == 0 {
		b.Fatal("no pieces")
	}
}

// preTokenizeOnly is encodeInto without the model, taking the same path to
// the pieces (streamed or as a list); it returns the number of pieces the
// model would have been given.
func preTokenizeOnly(t *Tokenizer, st *encodeState, text string) int {
	n := 0
	segment := func(s string, first bool) {
		if s == "" {
			return
		}
		if t.pre == nil {
			n++
			return
		}
		if scan := t.pre.soleIsolate(); scan != nil {
			isolateEach(s, scan, func(int, int) { n++ })
			return
		}
		if iso := t.pre.isolators; iso != nil {
			isolateChainEach(s, iso, func(int, int) { n++ })
			return
		}
		n += len(t.pre.run(st, piece{text: s, first: first}))
	}
	segs := t.added.split(text, t.added.raw, st.segs[:0], true)
	st.segs = segs
	for _, seg := range segs {
		if seg.id >= 0 {
			continue
		}
		s := seg.text
		if un, ok := t.normalizer.(unicodeNorm); ok {
			s = un.normalizeScratch(st, s)
		} else if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		if t.added.norm.empty() {
			segment(s, seg.first)
			continue
		}
		inner := t.added.split(s, t.added.norm, st.inner[:0], seg.first)
		st.inner = inner
		for _, in := range inner {
			if in.id < 0 {
				segment(in.text, in.first)
			}
		}
	}
	return n
}

// BenchmarkEncodeShort encodes one short chat-sized prompt, the router's
// common case, to show per-call overhead.
func BenchmarkEncodeShort(b *testing.B) {
	tok := loadFamily(b, "llama3")
	text := "You are a helpful assistant. Summarise the following text in three bullet points, please."
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		tok.Encode(text, true)
	}
}

// BenchmarkDecode decodes the corpus's ids.
func BenchmarkDecode(b *testing.B) {
	corpus := readCorpus(b)
	tok := loadFamily(b, "llama3")
	ids := tok.Encode(corpus, false)
	b.SetBytes(int64(len(corpus)))
	b.ReportAllocs()
	for b.Loop() {
		tok.Decode(ids)
	}
}

// BenchmarkLoad parses a whole tokenizer.json; the target is <= 500 ms for a
// ~10 MB file (qwen3's is 11 MB, llama3's 9 MB).
func BenchmarkLoad(b *testing.B) {
	for _, fam := range []string{"qwen3", "llama3"} {
		path := filepath.Join("testdata", fam, "tokenizer.json")
		st, err := os.Stat(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fam, func(b *testing.B) {
			b.SetBytes(st.Size())
			b.ReportAllocs()
			start := processCPU()
			for b.Loop() {
				if _, err := LoadFile(path); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((processCPU()-start).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// BenchmarkModelPerPiece splits uncached Encode's model half by piece: the
// corpus is pre-tokenized once, then each iteration runs, over every piece,
//   - "model": the BPE model (no piece cache), what Encode adds to
//     pre-tokenizing;
//   - "merge": the same, over only the pieces that need merges (reported
//     per such piece);
//   - "lookup": only the raw-byte vocabulary lookup every piece of two or
//     more bytes gets, as Encode does it (getAt, on the piece where it lies
//     in the text);
//   - "hash": only packing the piece's first bytes and hashing them, the
//     least any table lookup keyed by the piece costs.
//
// Each reports CPU ns per piece ("cpu-ns/piece", steadier than wall time
// on a shared machine), to set against pre-tokenizing's (BenchmarkPreTokenize's
// cpu-MB/s turned into time for the corpus, divided by the same piece count).
func BenchmarkModelPerPiece(b *testing.B) {
	corpus := readCorpus(b)
	for _, fam := range []string{"llama3", "qwen3"} {
		tok := uncached(loadFamily(b, fam))
		s := corpus
		if tok.normalizer != nil {
			s = tok.normalizer.normalize(s)
		}
		var pieces []string
		var spans [][2]int
		isolateEach(s, tok.pre.soleIsolate(), func(a, c int) {
			pieces = append(pieces, s[a:c])
			spans = append(spans, [2]int{a, c})
		})
		m := tok.model
		perPiece := func(b *testing.B, cpu cpuClock, n int) {
			spent := processCPU() - cpu.start
			b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/piece")
			b.ReportMetric(float64(n), "pieces")
		}
		// runModel runs the model (no piece cache) over list once per
		// iteration and returns the last iteration's ids.
		runModel := func(b *testing.B, list []string) []uint32 {
			st := getEncodeState()
			defer putEncodeState(st)
			dst := make([]uint32, 0, len(s))
			cpu := startCPUClock()
			for b.Loop() {
				dst = dst[:0]
				for _, p := range list {
					dst = m.encodePiece(st, p, dst)
				}
			}
			perPiece(b, cpu, len(list))
			return dst
		}
		b.Run(fam+"/model", func(b *testing.B) { runModel(b, pieces) })
		// merge: the model over only the pieces that need merges (two or
		// more bytes and not a token that the lookup answers alone), so the
		// figure is the cost of the merge path per such piece.
		var merged []string
		for _, p := range pieces {
			if len(p) < 2 {
				continue
			}
			if _, self, ok := m.raw.get(p); ok && (self || m.ignoreMerges) {
				continue
			}
			merged = append(merged, p)
		}
		b.Run(fam+"/merge", func(b *testing.B) {
			if len(merged) == 0 {
				b.Fatal("no piece needs merges")
			}
			dst := runModel(b, merged)
			if len(dst) <= len(merged) {
				b.Fatal("merged pieces gave no more ids than pieces")
			}
		})
		b.Run(fam+"/lookup", func(b *testing.B) {
			found := 0
			cpu := startCPUClock()
			for b.Loop() {
				found = 0
				for _, sp := range spans {
					if sp[1]-sp[0] > 1 {
						if _, _, ok := m.raw.getAt(s, sp[0], sp[1]); ok {
							found++
						}
					}
				}
			}
			perPiece(b, cpu, len(pieces))
			if found == 0 {
				b.Fatal("no piece found")
			}
		})
		b.Run(fam+"/hash", func(b *testing.B) {
			var sum uint64
			cpu := startCPUClock()
			for b.Loop() {
				for _, sp := range spans {
					a, c := sp[0], sp[1]
					switch {
					case c-a <= 1:
					case c-a <= 8 && a+8 <= len(s):
						sum += m.raw.hashHead(load64(s[a:])&headMask[c-a], c-a)
					default:
						sum += m.raw.hash(s[a:c], rawHead(s[a:c]))
					}
				}
			}
			perPiece(b, cpu, len(pieces))
			if sum == 0 {
				b.Fatal("no hash")
			}
		})
	}
}
