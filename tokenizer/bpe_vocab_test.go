package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestRawHeadMatchesByteLoop checks the overlapping-load rawHead against
// packing the bytes one by one, for every length up to 12.
func TestRawHeadMatchesByteLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 12; n++ {
		for k := 0; k < 200; k++ {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.IntN(256))
			}
			s := string(b)
			var want uint64
			for i := 0; i < n && i < 8; i++ {
				want |= uint64(s[i]) << (8 * i)
			}
			if got := rawHead(s); got != want {
				t.Fatalf("rawHead(%q) = %#x, want %#x", s, got, want)
			}
		}
	}
}

// TestRawVocabFindsEveryToken looks up every byte-level token by its bytes:
// the hot table and the full one must agree on every id, and a piece that
// is no token (a token with a byte added) must not be found as one.
func TestRawVocabFindsEveryToken(t *testing.T) {
	for _, fam := range []string{"llama3", "qwen3", "deepseek_v3"} {
		m := loadFamily(t, fam).model
		if m.raw == nil {
			t.Fatalf("%s: no raw vocabulary", fam)
		}
		hotHits := 0
		for tok, id := range m.vocab {
			raw, ok := byteLevelDecode(tok)
			if !ok || raw == "" {
				continue
			}
			got, _, found := m.raw.get(raw)
			if !found || got != id {
				t.Fatalf("%s: get(%q) = %d, %v; want %d", fam, raw, got, found, id)
			}
			if len(raw) <= 8 {
				h := m.raw.hash(raw, rawHead(raw)) & m.raw.hotMask
				if s := m.raw.hot[h]; s.meta != 0 && s.head == rawHead(raw) && int(s.meta&0xFF) == len(raw) {
					hotHits++
				}
			}
			// getAt finds it cut from a longer text (one load and a mask),
			// and at the very end of a text (the slow path).
			text := "xy" + raw + "\x00\x01\x02\x03\x04\x05\x06\x07"
			if got, _, found := m.raw.getAt(text, 2, 2+len(raw)); !found || got != id {
				t.Fatalf("%s: getAt(%q) = %d, %v; want %d", fam, raw, got, found, id)
			}
			if got, _, found := m.raw.getAt("z"+raw, 1, 1+len(raw)); !found || got != id {
				t.Fatalf("%s: getAt(%q) at the end = %d, %v; want %d", fam, raw, got, found, id)
			}
			if _, ok := m.vocab[byteLevelEncode(raw+"\x00")]; !ok {
				if _, _, found := m.raw.get(raw + "\x00"); found {
					t.Fatalf("%s: get(%q) found a token that is not in the vocabulary", fam, raw+"\x00")
				}
			}
		}
		if hotHits == 0 {
			t.Fatalf("%s: the hot table holds no token", fam)
		}
	}
}

// FuzzRawVocabGetAt checks that a piece looked up where it lies in a text
// (getAt) gives what looking up its bytes alone (get) gives.
func FuzzRawVocabGetAt(f *testing.F) {
	m := loadFamily(f, "llama3").model
	f.Add("Hello world, tokens!", 5, 11)
	f.Add("ab", 0, 2)
	f.Add(" the\x00\x00\x00\x00\x00", 0, 4)
	f.Fuzz(func(t *testing.T, s string, a, b int) {
		if a < 0 || b < a || b > len(s) {
			return
		}
		id, self, ok := m.raw.getAt(s, a, b)
		wid, wself, wok := m.raw.get(s[a:b])
		if id != wid || self != wself || ok != wok {
			t.Fatalf("getAt(%q, %d, %d) = %d %v %v; get(%q) = %d %v %v", s, a, b, id, self, ok, s[a:b], wid, wself, wok)
		}
	})
}

// TestPieceCacheReset empties the cache; encoding after a reset gives the
// same ids as before it and as no cache at all.
func TestPieceCacheReset(t *testing.T) {
	tok := loadFamily(t, "qwen3").WithPieceCache(64)
	none := loadFamily(t, "qwen3").WithPieceCache(0)
	if none.model.cache != nil {
		t.Fatal("WithPieceCache(0) left a cache")
	}
	text := "Tokenization tokenizers tokenizing: 你好世界 naïve façade"
	want := none.Encode(text, false)
	first := tok.Encode(text, false)
	hits, misses := pieceCacheHits(tok, text)
	if misses == 0 {
		t.Fatal("no piece needed merges; the test text is too simple")
	}
	if hits != 0 {
		t.Fatalf("%d hits right after emptying the cache, on text without repeated words", hits)
	}
	if hits, _ := pieceCacheHits(tok, text+" "+text); hits == 0 {
		t.Fatal("the text repeated gave no piece-cache hit")
	}
	tok.model.cache.put("filled", []uint32{1})
	tok.model.cache.reset()
	for i := range tok.model.cache.slots {
		if tok.model.cache.slots[i].Load() != nil {
			t.Fatalf("slot %d holds an entry after reset", i)
		}
	}
	if again := tok.Encode(text, false); !slices.Equal(first, want) || !slices.Equal(again, want) {
		t.Fatalf("with cache %v, after reset %v, without %v", first, again, want)
	}
}

// TestPieceCacheEntriesAreCopies checks that a cached entry owns its key and
// ids: changing the caller's buffers afterwards does not change it.
func TestPieceCacheEntriesAreCopies(t *testing.T) {
	c := newPieceCache(8)
	key := []byte("abcdefg")
	ids := []uint32{1, 2, 3}
	c.put(string(key), ids)
	key[0], ids[0] = 'x', 99
	got, ok := c.get("abcdefg")
	if !ok || !slices.Equal(got, []uint32{1, 2, 3}) {
		t.Fatalf("get = %v, %v", got, ok)
	}
	if cap(got) != len(got) {
		t.Fatalf("cached ids have spare capacity %d: a caller's append could write into the entry", cap(got))
	}
}

// TestSmallPieceCacheConcurrent encodes from many goroutines through a
// two-slot cache, so entries are replaced all the time (run with -race).
func TestSmallPieceCacheConcurrent(t *testing.T) {
	base := loadFamily(t, "llama3")
	tok := base.WithPieceCache(2)
	ref := base.WithPieceCache(0)
	var inputs []string
	for i := 0; i < 12; i++ {
		inputs = append(inputs, fmt.Sprintf("unbelievably%d transmogrification%d %s", i, i*7, strings.Repeat("zyx", i)))
	}
	want := make([][]uint32, len(inputs))
	for i, s := range inputs {
		want[i] = ref.Encode(s, false)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 100; k++ {
				i := (g + k) % len(inputs)
				if got := tok.Encode(inputs[i], false); !slices.Equal(got, want[i]) {
					errs <- fmt.Sprintf("Encode(%q) = %v, want %v", inputs[i], got, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestPairFilter checks the pair table's filter: every merge is still found
// with its value, and most pairs that do not merge are turned away by it.
func TestPairFilter(t *testing.T) {
	for _, fam := range []string{"llama3", "qwen3"} {
		pt := loadFamily(t, fam).model.merges
		if pt.filter == nil {
			t.Fatalf("%s: no filter", fam)
		}
		keys := 0
		for _, s := range pt.slots {
			if s.key == emptyPair {
				continue
			}
			keys++
			if v, ok := pt.get(s.key); !ok || v != s.val {
				t.Fatalf("%s: get(%#x) = %#x, %v; want %#x", fam, s.key, v, ok, s.val)
			}
		}
		r := rand.New(rand.NewPCG(5, 6))
		passed, absent := 0, 0
		for k := 0; k < 100000; k++ {
			key := uint64(r.IntN(1<<17))<<32 | uint64(r.IntN(1<<17))
			if _, ok := pt.get(key); ok {
				continue
			}
			absent++
			if w, b := pt.filterBits(key); pt.filter[w]&b == b {
				passed++
			}
		}
		if rate := float64(passed) / float64(absent); rate > 0.2 {
			t.Fatalf("%s: the filter lets %.0f %% of absent pairs through", fam, 100*rate)
		} else {
			t.Logf("%s: %d merges, filter %d KB, %.1f %% of absent pairs pass it", fam, keys, len(pt.filter)*8/1024, 100*rate)
		}
	}
}
