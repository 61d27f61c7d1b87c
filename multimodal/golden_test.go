package multimodal

import (
	"compress/gzip"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// golden is testdata/golden.json, written by gen/mm.mjs from the Hugging
// Face processors of transformers.js.
type golden struct {
	TransformersJS string `json:"transformers_js"`
	Sizes          []struct {
		W, H  int
		Qwen  goldenGrid `json:"qwen2.5-vl"`
		Qwen3 goldenGrid `json:"qwen3-vl"`
	} `json:"sizes"`
	Chats []struct {
		Family   string `json:"family"`
		Messages []struct {
			Role    string `json:"role"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
				Size []int  `json:"size"`
			} `json:"content"`
		} `json:"messages"`
		IDsRLE [][2]uint32 `json:"ids_rle"`
	} `json:"chats"`
}

type goldenGrid struct {
	Resized []int  `json:"resized"`
	Tokens  int    `json:"tokens"`
	Error   string `json:"error"`
}

func loadGolden(t *testing.T) golden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// jsDivergence says where transformers.js's smart_resize is known to differ
// from the Python one vLLM runs (transformers
// models/qwen2_vl/image_processing_qwen2_vl.py): JavaScript's Math.round
// rounds halves up where Python's round rounds them to even, and
// transformers.js first scales an image with a side under the factor up to
// the factor (Python does not).
func jsDivergence(w, h, factor int) bool {
	half := func(side int) bool { return 2*side%factor == 0 && (2*side/factor)%2 == 1 }
	return half(w) || half(h) || w < factor || h < factor
}

func TestImageTokensMatchTheHFProcessor(t *testing.T) {
	g := loadGolden(t)
	for _, fam := range []Family{FamilyQwen2VL, FamilyQwen3VL} {
		p := DefaultProcessor(fam)
		factor := p.PatchSize * p.MergeSize
		exact, diverged := 0, 0
		for _, s := range g.Sizes {
			want := s.Qwen
			if fam == FamilyQwen3VL {
				want = s.Qwen3
			}
			got, err := p.ImageTokens(s.W, s.H)
			if want.Error != "" {
				if err == nil {
					t.Errorf("%s %d×%d: the processor refuses it (%s), got %d tokens", fam, s.W, s.H, want.Error, got)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s %d×%d: %v", fam, s.W, s.H, err)
				continue
			}
			if got == want.Tokens {
				exact++
				continue
			}
			if !jsDivergence(s.W, s.H, factor) {
				t.Errorf("%s %d×%d: %d tokens, the processor gives %d (resized %v)", fam, s.W, s.H, got, want.Tokens, want.Resized)
				continue
			}
			diverged++
		}
		t.Logf("%s: %d sizes exact, %d at a known transformers.js/Python divergence", fam, exact, diverged)
		if exact < 50 {
			t.Errorf("%s: only %d sizes match exactly, want at least 50", fam, exact)
		}
	}
}

// Python's rounding of halves, checked where transformers.js differs.
func TestSmartResizeRoundsHalvesToEven(t *testing.T) {
	// 70/28 = 2.5 rounds to 2 in Python: 56×56, 4 tokens (transformers.js: 84×84).
	if h, w, _ := SmartResize(70, 70, 28, 3136, 12845056); h != 56 || w != 56 {
		t.Fatalf("70×70 → %d×%d, want 56×56", h, w)
	}
	// 98/28 = 3.5 rounds to 4.
	if h, _, _ := SmartResize(98, 1000, 28, 3136, 12845056); h != 112 {
		t.Fatalf("98 → %d, want 112", h)
	}
	if _, _, err := SmartResize(1, 201, 28, 3136, 12845056); err == nil {
		t.Fatal("an aspect ratio over 200 must be refused")
	}
}

var (
	chatsOnce sync.Once
	chats     map[Family]*tokenizer.Chat
	chatsErr  error
)

func loadChats(t testing.TB) map[Family]*tokenizer.Chat {
	t.Helper()
	chatsOnce.Do(func() {
		chats = map[Family]*tokenizer.Chat{}
		q, err := tokenizer.LoadChat(filepath.Join("..", "tokenizer", "testdata", "qwen3"), filepath.Join("testdata", "qwen2.5-vl.jinja"), tokenizer.ChatOptions{})
		if err != nil {
			chatsErr = err
			return
		}
		chats[FamilyQwen2VL], chats[FamilyQwen3VL] = q, q
		chats[FamilyGemma3], chatsErr = loadGemma()
	})
	if chatsErr != nil {
		t.Fatal(chatsErr)
	}
	return chats
}

func loadGemma() (*tokenizer.Chat, error) {
	f, err := os.Open(filepath.Join("testdata", "gemma3", "tokenizer.json.gz"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Parse(data)
	if err != nil {
		return nil, err
	}
	cfgData, err := os.ReadFile(filepath.Join("testdata", "gemma3", "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	cfg, err := tokenizer.ParseConfig(cfgData)
	if err != nil {
		return nil, err
	}
	// Gemma 3's template with its one parenthesized conditional written as
	// an if block, as tokenizer/testdata/chat/gemma3-parts.jsonl has it:
	// kvroute's Jinja engine cannot parse the original (see
	// TestTemplatesGemmaCannotParseClearly); gen/mm.mjs renders this same
	// file.
	tpl, err := os.ReadFile(filepath.Join("testdata", "gemma3.jinja"))
	if err != nil {
		return nil, err
	}
	return tokenizer.NewChat(tok, cfg, tokenizer.ChatOptions{TemplateOverride: string(tpl)})
}

// pngHeader is a PNG signature and IHDR chunk: all image.DecodeConfig reads.
func pngHeader(w, h int) []byte {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2 // 8-bit RGB
	b := []byte("\x89PNG\r\n\x1a\n")
	b = binary.BigEndian.AppendUint32(b, 13)
	chunk := append([]byte("IHDR"), ihdr[:]...)
	b = append(b, chunk...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(chunk))
}

func pngDataURL(w, h int) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(pngHeader(w, h))
}

func TestChatTokenIDsMatchTheHFProcessor(t *testing.T) {
	g := loadGolden(t)
	cs := loadChats(t)
	for i, c := range g.Chats {
		fam, err := ParseFamily(c.Family)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []any
		nImages := 0
		for _, m := range c.Messages {
			var parts []any
			for _, p := range m.Content {
				if p.Type == "image" {
					parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": pngDataURL(p.Size[0], p.Size[1])}})
					nImages++
					continue
				}
				parts = append(parts, map[string]any{"type": "text", "text": p.Text})
			}
			msgs = append(msgs, map[string]any{"role": m.Role, "content": parts})
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		req, err := tokenizer.ParseChatRequest(body)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := NewSpec(DefaultProcessor(fam), cs[fam].Tokenizer())
		if err != nil {
			t.Fatal(err)
		}
		enc, err := EncodeChat(cs[fam], spec, req, nil)
		if err != nil {
			t.Fatalf("chat %d (%s): %v", i, fam, err)
		}
		var want []uint32
		for _, r := range c.IDsRLE {
			for k := uint32(0); k < r[1]; k++ {
				want = append(want, r[0])
			}
		}
		if !slices.Equal(enc.Tokens, want) {
			at := 0
			for at < min(len(want), len(enc.Tokens)) && want[at] == enc.Tokens[at] {
				at++
			}
			t.Errorf("chat %d (%s): %d tokens, the processor gives %d; first difference at %d", i, fam, len(enc.Tokens), len(want), at)
			continue
		}
		if len(enc.Placements) != nImages || len(enc.Items) != nImages || enc.Cut {
			t.Errorf("chat %d (%s): %d placements, %d items for %d images (cut %v)", i, fam, len(enc.Placements), len(enc.Items), nImages, enc.Cut)
		}
		for _, pl := range enc.Placements {
			if pl.Offset < 0 || pl.Offset+pl.Length > len(enc.Tokens) {
				t.Errorf("chat %d: placement %+v outside %d tokens", i, pl, len(enc.Tokens))
			}
		}
	}
}
