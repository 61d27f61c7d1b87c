package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// randomText builds text that stresses tokenization at chunk edges: spaces
// and newlines at both ends, digits, punctuation, CJK, emoji, and sometimes
// special-token look-alikes and real special tokens inside the text.
func randomText(r *rand.Rand, words int, specials []string) string {
	pieces := []string{"the", "quick", "brown", "fox", " ", "  ", "\n", "\n\n", "\t", "123", "4567", "3.14",
		"don't", "WE'RE", "東京", "日本語", "😀", "é", "e\u0301", "<|", "|>", "<", ">", "```", "func()", "{\"a\": 1}",
		"ſ", "İ", "x²", "—", "\r\n", "[INST]", "</s", "<think>", "</think>"}
	var b strings.Builder
	for range words {
		if len(specials) > 0 && r.IntN(40) == 0 {
			b.WriteString(specials[r.IntN(len(specials))])
			continue
		}
		b.WriteString(pieces[r.IntN(len(pieces))])
		if r.IntN(3) > 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

func randomConversation(r *rand.Rand, turns int, specials []string) ChatRequest {
	var req ChatRequest
	if r.IntN(2) == 0 {
		req.Messages = append(req.Messages, Message{Role: "system", Content: randomText(r, 1+r.IntN(30), specials)})
	}
	for i := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		req.Messages = append(req.Messages, Message{Role: role, Content: randomText(r, r.IntN(60), specials)})
	}
	return req
}

// The cache must never change ids: over many random multi-turn
// conversations, encoding each growing prefix with a shared cache gives what
// a cold Encode gives.
func TestPrefixCacheIDsEqualUncachedEncode(t *testing.T) {
	families := []struct{ tok, template string }{
		{"llama3", "library/llama3.1:8b"},
		{"qwen3", "library/qwen3:0.6b"},
		{"qwen3", "library/qwen2.5:0.5b"},
		{"mistral-sp", "library/mixtral:8x7b"},
		{"deepseek_v3", "library/deepseek-v3:671b"},
	}
	conversations := 25
	if testing.Short() {
		conversations = 5
	}
	for _, f := range families {
		t.Run(f.template, func(t *testing.T) {
			chat := testChat(t, f.tok, f.template, 1<<20) // small, so eviction happens too
			tok := chat.Tokenizer()
			var specials []string
			for _, s := range tok.SpecialTokens() {
				if len(specials) < 12 {
					specials = append(specials, s.Content)
				}
			}
			r := rand.New(rand.NewPCG(uint64(len(f.template)), 7))
			checked := 0
			for n := range conversations {
				full := randomConversation(r, 2+r.IntN(10), specials)
				for turn := 1; turn <= len(full.Messages); turn++ {
					req := ChatRequest{Messages: full.Messages[:turn]}
					text, err := chat.ApplyChatTemplate(req)
					if err != nil {
						continue // e.g. Mistral refusing a system message
					}
					got := chat.EncodePrompt(text)
					want := tok.Encode(text, false)
					if !slices.Equal(got, want) {
						t.Fatalf("conversation %d turn %d: cached ids differ\ntext: %q\n got: %v\nwant: %v", n, turn, text, got, want)
					}
					checked++
				}
			}
			st := chat.Cache().Stats()
			if checked == 0 || st.Hits == 0 {
				t.Fatalf("checked %d prompts, cache stats %+v: the cache was not exercised", checked, st)
			}
			if st.Fallbacks != 0 {
				t.Errorf("fallbacks = %d, want 0", st.Fallbacks)
			}
		})
	}
}

func TestPrefixCacheStaysWithinItsBound(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	const bound = 4 << 10
	c := NewPrefixCache(tok, bound)
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		text := "<|im_start|>user\n" + randomText(r, 50, nil) + "<|im_end|>\n<|im_start|>assistant\n"
		if got, want := c.Encode(text), tok.Encode(text, false); !slices.Equal(got, want) {
			t.Fatalf("ids differ for %q", text)
		}
	}
	st := c.Stats()
	if st.Bytes > bound || st.Entries == 0 {
		t.Fatalf("stats %+v: want 0 < bytes <= %d", st, bound)
	}
}

// Boundary tokens that another added token overlaps must not be used as cut
// points, or the pieces would tokenize differently from the whole.
func TestBoundaryTokensRejectOverlappingOccurrences(t *testing.T) {
	b := &boundaryTokens{byText: map[string]AddedToken{}, conflict: map[string][]string{}}
	b.raw = append(b.raw,
		AddedToken{ID: 1, Content: "<end>", Special: true},
		AddedToken{ID: 2, Content: "<end>>", Special: true},
		AddedToken{ID: 3, Content: "d><x", Special: true},
	)
	b.byText["<end>"] = b.raw[0]
	b.first['<'] = true
	b.lengths = []int{5}
	for _, tc := range []struct {
		text string
		want int
	}{
		{"a<end>b", 1},
		{"a<end>>b", 0},  // the longer token wins at the same position
		{"a<end><xb", 0}, // "d><x" straddles the end
		{"a<end>b<end>", 2},
	} {
		if got := len(b.cuts(tc.text)); got != tc.want {
			t.Errorf("cuts(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
}

func TestPrefixCacheIsSafeForConcurrentUse(t *testing.T) {
	chat := testChat(t, "llama3", "library/llama3.1:8b", 256<<10)
	tok := chat.Tokenizer()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for range 15 {
				req := randomConversation(r, 6, nil)
				text, err := chat.ApplyChatTemplate(req)
				if err != nil {
					errs <- err
					return
				}
				want := tok.Encode(text, false)
				if !slices.Equal(chat.EncodePrompt(text), want) {
					errs <- fmt.Errorf("ids differ for %q", text)
					return
				}
				// EncodeChat renders into pooled buffers that the other
				// goroutines reuse; its ids must not see their text.
				ids, err := chat.EncodeChat(req)
				if err != nil {
					errs <- err
					return
				}
				if !slices.Equal(ids, want) {
					errs <- fmt.Errorf("EncodeChat ids differ for %q", text)
					return
				}
				// Appending keeps what dst held and adds the same ids.
				dst := append(make([]uint32, 0, 4), 7, 8)
				ids, err = chat.AppendEncodeChat(dst, req)
				if err != nil {
					errs <- err
					return
				}
				if !slices.Equal(ids[:2], []uint32{7, 8}) || !slices.Equal(ids[2:], want) {
					errs <- fmt.Errorf("AppendEncodeChat ids differ for %q", text)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// longConversation is a 20-turn chat of about 32k Llama 3 tokens.
func longConversation(turns int) ChatRequest {
	r := rand.New(rand.NewPCG(42, 42))
	words := []string{"router", "cache", "token", "block", "worker", "latency", "prefill", "decode", "the", "a",
		"of", "and", "to", "in", "is", "for", "with", "GPU", "KV", "hit", "rate", "12", "345", "func", "return", "err"}
	req := ChatRequest{Messages: []Message{{Role: "system", Content: "You are a helpful assistant."}}}
	for i := range turns * 2 {
		var b strings.Builder
		for range 700 {
			b.WriteString(words[r.IntN(len(words))])
			if r.IntN(12) == 0 {
				b.WriteString(".\n")
			} else {
				b.WriteByte(' ')
			}
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		req.Messages = append(req.Messages, Message{Role: role, Content: b.String()})
	}
	req.Messages = req.Messages[:len(req.Messages)-1] // end on the user's turn 20
	return req
}

// BenchmarkChatTurn20Warm encodes turn 20 of a 20-turn, ~32k-token
// conversation whose earlier turns are in the prefix cache, as a router sees
// it: rendering, cutting, lookups, and encoding the new user turn (~800
// tokens, different in every iteration so that it is never a cache hit).
func BenchmarkChatTurn20Warm(b *testing.B) {
	chat := testChat(b, "llama3", "library/llama3.1:8b", 0)
	req := longConversation(20)
	last := len(req.Messages) - 1
	prev := ChatRequest{Messages: req.Messages[:last]}
	if _, err := chat.EncodeChat(prev); err != nil { // turns 1..19 are cached
		b.Fatal(err)
	}
	msgs := slices.Clone(req.Messages)
	turn := msgs[last].Content
	tokens := 0
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n++
		msgs[last].Content = strconv.Itoa(n) + turn
		ids, err := chat.EncodeChat(ChatRequest{Messages: msgs})
		if err != nil {
			b.Fatal(err)
		}
		tokens = len(ids)
	}
	b.ReportMetric(float64(tokens), "tokens")
}

// BenchmarkChatTurn20Repeat resends an identical prompt: every chunk hits.
func BenchmarkChatTurn20Repeat(b *testing.B) {
	chat := testChat(b, "llama3", "library/llama3.1:8b", 0)
	req := longConversation(20)
	if _, err := chat.EncodeChat(req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chat.EncodeChat(req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChatTurn20Render is the template rendering alone.
func BenchmarkChatTurn20Render(b *testing.B) {
	chat := testChat(b, "llama3", "library/llama3.1:8b", 0)
	req := longConversation(20)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chat.ApplyChatTemplate(req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChatTurn20Cold encodes the same prompt without the cache.
func BenchmarkChatTurn20Cold(b *testing.B) {
	chat := testChat(b, "llama3", "library/llama3.1:8b", -1)
	req := longConversation(20)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chat.EncodeChat(req); err != nil {
			b.Fatal(err)
		}
	}
}

// AppendEncodeChat adds what EncodeChat returns after dst's own ids, with
// and without the prefix cache.
func TestAppendEncodeChatKeepsDstAndAddsTheSameIDs(t *testing.T) {
	for _, cacheBytes := range []int{0, -1} {
		chat := testChat(t, "qwen3", "library/qwen3:0.6b", cacheBytes)
		req := randomConversation(rand.New(rand.NewPCG(5, 5)), 4, nil)
		want, err := chat.EncodeChat(req)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 { // the second time every chunk is a cache hit
			got, err := chat.AppendEncodeChat([]uint32{1, 2, 3}, req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got[:3], []uint32{1, 2, 3}) || !slices.Equal(got[3:], want) {
				t.Fatalf("cache %d: AppendEncodeChat = %v..., want [1 2 3] + %d ids", cacheBytes, got[:min(len(got), 8)], len(want))
			}
		}
	}
}
