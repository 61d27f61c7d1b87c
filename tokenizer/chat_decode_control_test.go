package tokenizer

import (
	"strings"
	"testing"
)

// hasControl's word-at-a-time trick must agree with a byte loop for every
// position in and around an 8-byte word, for bytes on both sides of 0x20
// and above 0x7f.
func TestHasControlFindsEveryControlByte(t *testing.T) {
	for n := range 20 {
		for pos := range n {
			for _, c := range []byte{0x00, 0x1f, 0x20, 0x7f, 0x80, 0xff, 'a'} {
				b := []byte(strings.Repeat("x", n))
				b[pos] = c
				if got, want := hasControl(b), c < 0x20; got != want {
					t.Fatalf("hasControl(%q) = %v, want %v", b, got, want)
				}
			}
		}
	}
}
