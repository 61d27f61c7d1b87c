package multimodal

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"testing"
)

func TestIdentify(t *testing.T) {
	data := []byte("not really an image")
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(data)
	sum := sha256.Sum256(data)
	it, err := Identify(url, "")
	if err != nil || it.ID != hex.EncodeToString(sum[:]) || !it.Derived || it.Remote || !bytes.Equal(it.Data, data) {
		t.Fatalf("data URL: %+v %v", it, err)
	}
	// Unpadded base64 decodes to the same bytes and identity.
	it2, err := Identify("data:image/png;base64,"+base64.RawStdEncoding.EncodeToString(data), "")
	if err != nil || it2.ID != it.ID {
		t.Fatalf("unpadded: %+v %v", it2, err)
	}
	if it, err := Identify(url, "client-uuid"); err != nil || it.ID != "client-uuid" || it.Derived {
		t.Fatalf("uuid must win: %+v %v", it, err)
	}
	remote := "https://example.com/cat.png"
	rsum := sha256.Sum256([]byte(remote))
	if it, err := Identify(remote, ""); err != nil || !it.Remote || it.ID != hex.EncodeToString(rsum[:]) || it.Data != nil {
		t.Fatalf("remote: %+v %v", it, err)
	}
	for _, bad := range []string{"data:image/png;base64", "data:image/png;base64,@@@", "data:,%zz"} {
		if _, err := Identify(bad, ""); !errors.Is(err, ErrDataURL) {
			t.Errorf("%q: err %v", bad, err)
		}
	}
	if b, err := DecodeDataURL("data:text/plain,a%20b"); err != nil || string(b) != "a b" {
		t.Fatalf("percent-encoded: %q %v", b, err)
	}
}

func TestSizeReadsHeadersOfEveryFormat(t *testing.T) {
	img := image.NewPaletted(image.Rect(0, 0, 37, 21), color.Palette{color.Black, color.White})
	var pngBuf, jpgBuf, gifBuf bytes.Buffer
	if err := png.Encode(&pngBuf, img); err != nil {
		t.Fatal(err)
	}
	if err := jpeg.Encode(&jpgBuf, img, nil); err != nil {
		t.Fatal(err)
	}
	if err := gif.Encode(&gifBuf, img, nil); err != nil {
		t.Fatal(err)
	}
	// A lossless WebP header (VP8L) for 37×21: RIFF, WEBP, VP8L chunk with
	// the signature byte and 14-bit width-1 and height-1.
	bits := uint32(37-1) | uint32(21-1)<<14
	vp8l := []byte{0x2f, byte(bits), byte(bits >> 8), byte(bits >> 16), byte(bits >> 24), 0, 0, 0}
	webp := append([]byte("RIFF"), le32(uint32(4+8+len(vp8l)))...)
	webp = append(webp, "WEBPVP8L"...)
	webp = append(webp, le32(uint32(len(vp8l)))...)
	webp = append(webp, vp8l...)
	for name, data := range map[string][]byte{
		"png": pngBuf.Bytes(), "jpeg": jpgBuf.Bytes(), "gif": gifBuf.Bytes(), "webp": webp,
		"png header only": pngHeader(37, 21),
	} {
		w, h, err := Size(data)
		if err != nil || w != 37 || h != 21 {
			t.Errorf("%s: %d×%d %v", name, w, h, err)
		}
	}
	for name, data := range map[string][]byte{"empty": nil, "text": []byte("hello"), "zero": pngHeader(0, 5), "huge": pngHeader(1<<20, 5)} {
		if _, _, err := Size(data); !errors.Is(err, ErrImage) {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

func FuzzDecodeDataURL(f *testing.F) {
	f.Add("data:image/png;base64,iVBORw0KGgo=")
	f.Add("data:,a%20b")
	f.Add("https://x")
	f.Fuzz(func(t *testing.T, s string) {
		it, err := Identify(s, "")
		if err == nil && it.ID == "" {
			t.Fatal("an identified image must have an id")
		}
		if it.Data != nil {
			_, _, _ = Size(it.Data)
		}
	})
}

func FuzzSize(f *testing.F) {
	f.Add(pngHeader(10, 10))
	f.Add([]byte("GIF89a\x01\x00\x01\x00"))
	f.Add([]byte("RIFF\x00\x00\x00\x00WEBPVP8 "))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, h, err := Size(data)
		if err == nil && (w < 1 || h < 1 || w > MaxSide || h > MaxSide) {
			t.Fatalf("size %d×%d accepted", w, h)
		}
		if err == nil {
			p := DefaultProcessor(FamilyQwen2VL)
			_, _ = p.ImageTokens(w, h)
		}
	})
}
