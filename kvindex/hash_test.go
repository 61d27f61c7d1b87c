package kvindex

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

func TestHashBlocksChainsFullBlocksOnly(t *testing.T) {
	seed := Seed("m", "", "")
	toks := doc(3, 3)
	all := HashBlocks(seed, append(toks, 1, 2), testBS, nil)
	if len(all) != 3 {
		t.Fatalf("got %d hashes for 3 full blocks and a partial one", len(all))
	}
	// Chaining from a prefix's last hash gives the same tail.
	tail := HashBlocks(all[0], toks[testBS:], testBS, nil)
	if tail[0] != all[1] || tail[1] != all[2] {
		t.Fatal("hashing a suffix from its parent hash differs from hashing the whole")
	}
	// Large blocks take the streaming path and agree with themselves.
	big := make([]uint32, 1000)
	for i := range big {
		big[i] = uint32(i)
	}
	h1 := HashBlocks(seed, big, 500, nil)
	h2 := HashBlocks(seed, big[:500], 500, nil)
	if len(h1) != 2 || h1[0] != h2[0] {
		t.Fatal("large-block hashing is inconsistent")
	}
	if HashBlocks(seed, toks, 0, nil) != nil {
		t.Fatal("block size 0 must hash nothing")
	}
	seeds := map[uint64]bool{}
	for _, s := range [][3]string{{"m", "", ""}, {"m", "a", ""}, {"m", "", "a"}, {"ma", "", ""}, {"m", "a", "b"}, {"m", "ab", ""}} {
		seeds[Seed(s[0], s[1], s[2])] = true
	}
	if len(seeds) != 6 {
		t.Fatal("distinct (model, lora, salt) triples share a seed")
	}
}

func TestHashBlocksStreamingPathMatchesStackPath(t *testing.T) {
	// 128 tokens uses the stack buffer, 129 the streaming hasher; both
	// must implement the same formula, checked on a hand-built buffer.
	for _, bs := range []int{128, 129} {
		toks := make([]uint32, bs)
		for i := range toks {
			toks[i] = uint32(i * 7)
		}
		got := HashBlocks(42, toks, bs, nil)[0]
		buf := make([]byte, 0, 8+4*bs)
		buf = append(buf, 42, 0, 0, 0, 0, 0, 0, 0)
		for _, t := range toks {
			buf = append(buf, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
		}
		if want := nonZero(xxh3Hash(buf)); got != want {
			t.Fatalf("block size %d: %x, want %x", bs, got, want)
		}
	}
}

// TestHashBlock16MatchesXXH3 holds the 16-token step to xxh3 of the bytes
// it stands for, on random and on extreme tokens and parents.
func TestHashBlock16MatchesXXH3(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var toks [16]uint32
	buf := make([]byte, 72)
	for trial := range 20000 {
		prev := rng.Uint64()
		for i := range toks {
			switch trial % 4 {
			case 0:
				toks[i] = rng.Uint32()
			case 1:
				toks[i] = uint32(rng.IntN(200000)) // token ids as tokenizers give them
			case 2:
				toks[i] = ^uint32(0)
				prev = ^uint64(0)
			default:
				toks[i], prev = 0, 0
			}
		}
		binary.LittleEndian.PutUint64(buf, prev)
		for i, tok := range toks {
			binary.LittleEndian.PutUint32(buf[8+4*i:], tok)
		}
		if got, want := hashBlock16(prev, &toks), xxh3Hash(buf); got != want {
			t.Fatalf("trial %d: hashBlock16 = %#x, xxh3 = %#x", trial, got, want)
		}
	}
	// HashBlocks takes the path for block size 16 and chains it.
	all := HashBlocks(7, doc(5, 6), 16, nil)
	prev := uint64(7)
	for j, h := range all {
		b := binary.LittleEndian.AppendUint64(nil, prev)
		for _, tok := range doc(5, 6)[16*j : 16*j+16] {
			b = binary.LittleEndian.AppendUint32(b, tok)
		}
		if want := nonZero(xxh3Hash(b)); h != want {
			t.Fatalf("block %d: %#x, want %#x", j, h, want)
		}
		prev = h
	}
}
