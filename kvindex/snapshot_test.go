package kvindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// snapIndex builds an index of three workers with shared and private
// chains, an off-device block, a stale worker and duplicate engine keys.
func snapIndex(t testing.TB) (*Index, [][]uint64) {
	t.Helper()
	ix := New(Config{})
	seed := Seed("m", "", "")
	var prompts [][]uint64
	for w := range 3 {
		name := fmt.Sprint("w", w)
		ix.AddWorker(name, "m", benchBS)
		for c := range 4 {
			toks, hs := benchChain(c+w*2, 8)
			st := ix.Apply(name, vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: benchBS}}})
			if st.StoredBlocks == 0 {
				t.Fatalf("nothing stored: %+v", st)
			}
			prompts = append(prompts, HashBlocks(seed, toks, benchBS, nil))
		}
	}
	toks, hs := benchChain(99, 4)
	cpu := vllmwire.MediumCPU
	ix.Apply("w1", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: benchBS, Medium: &cpu}}})
	prompts = append(prompts, HashBlocks(seed, toks, benchBS, nil))
	ix.MarkStale("w2")
	return ix, prompts
}

func matchAll(ix *Index, prompts [][]uint64) []MatchResult {
	var out []MatchResult
	for _, p := range prompts {
		out = append(out, ix.Match(p, []string{"w0", "w1", "w2"}, nil)...)
	}
	return out
}

func TestSnapshotRoundTripKeepsEveryAnswer(t *testing.T) {
	src, prompts := snapIndex(t)
	var buf bytes.Buffer
	if err := src.WriteSnapshot(&buf, map[string]uint64{"w0": 41, "w2": 7}); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSnapshot(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Seqs(); len(got) != 2 || got["w0"] != 41 || got["w2"] != 7 {
		t.Fatalf("seqs %v", got)
	}
	dst := New(Config{})
	for _, w := range []string{"w0", "w1", "w2"} {
		dst.AddWorker(w, "m", benchBS)
	}
	dst.AddWorker("w9", "m", benchBS) // not in the snapshot: untouched
	st := dst.LoadSnapshot(s)
	if st.Workers != 3 || st.Skipped != 0 || st.Entries != src.Stats().Entries {
		t.Fatalf("load stats %+v, source has %d entries", st, src.Stats().Entries)
	}
	if a, b := matchAll(src, prompts), matchAll(dst, prompts); !slices.Equal(a, b) {
		t.Fatalf("matches differ after the round trip:\n src %v\n dst %v", a, b)
	}
	for i, ws := range src.Stats().PerWorker {
		if got := dst.Stats().PerWorker[i]; got != ws {
			t.Errorf("worker stats %+v, want %+v", got, ws)
		}
	}
	// Live events keep applying on the loaded view: a removal of a loaded
	// block takes it out.
	_, hs := benchChain(0, 8)
	if r := dst.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockRemoved{BlockHashes: hs}}}); r.RemovedBlocks != 8 {
		t.Fatalf("removed %d loaded blocks, want 8 (%+v)", r.RemovedBlocks, r)
	}
}

func TestLoadSnapshotSkipsUnknownOrChangedWorkers(t *testing.T) {
	src, _ := snapIndex(t)
	var buf bytes.Buffer
	if err := src.WriteSnapshot(&buf, nil); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSnapshot(&buf)
	if err != nil {
		t.Fatal(err)
	}
	dst := New(Config{})
	dst.AddWorker("w0", "other-model", benchBS)
	dst.AddWorker("w1", "m", 32)
	if st := dst.LoadSnapshot(s); st.Workers != 0 || st.Skipped != 3 || dst.Stats().Entries != 0 {
		t.Fatalf("load stats %+v, entries %d; want everything skipped", st, dst.Stats().Entries)
	}
}

func TestReadSnapshotRefusesBadInput(t *testing.T) {
	src, _ := snapIndex(t)
	var buf bytes.Buffer
	if err := src.WriteSnapshot(&buf, nil); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	flip := func(i int) []byte { b := slices.Clone(good); b[i] ^= 0x40; return b }
	version := slices.Clone(good)
	binary.LittleEndian.PutUint16(version[8:], 2)
	for name, data := range map[string][]byte{
		"empty":     nil,
		"bad magic": flip(0),
		"version 2": version,
		"truncated": good[:len(good)/2],
		"no crc":    good[:len(good)-4],
		"bit flip":  flip(len(good) / 2),
		"trailer":   flip(len(good) - 1),
		"huge count": append(append([]byte(SnapshotMagic), 1, 0, 0, 0),
			0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
	} {
		if _, err := ReadSnapshot(bytes.NewReader(data)); !errors.Is(err, ErrSnapshot) {
			t.Errorf("%s: err %v, want ErrSnapshot", name, err)
		}
	}
}

func FuzzReadSnapshot(f *testing.F) {
	src, _ := snapIndex(f)
	var buf bytes.Buffer
	if err := src.WriteSnapshot(&buf, map[string]uint64{"w1": 3}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(SnapshotMagic))
	f.Add(append([]byte(SnapshotMagic), 1, 0, 0, 0, 0, 0, 0, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ReadSnapshot(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrSnapshot) {
				t.Fatalf("error %v does not wrap ErrSnapshot", err)
			}
			return
		}
		// Whatever decodes loads, and writes back to an equal snapshot.
		ix := New(Config{})
		for _, w := range s.Workers {
			ix.AddWorker(w.ID, w.Model, w.BlockSize)
		}
		ix.LoadSnapshot(s)
		var out bytes.Buffer
		if err := ix.WriteSnapshot(&out, s.Seqs()); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadSnapshot(&out); err != nil {
			t.Fatalf("re-encoded snapshot unreadable: %v", err)
		}
	})
}

// BenchmarkSnapshot1M measures a warm start's index work for 1 M entries
// (16 workers × 65,536 blocks): writing the snapshot at the peer, and
// decoding plus loading it at the restarting replica.
func BenchmarkSnapshot1M(b *testing.B) {
	const workers, perWorker = 16, 1 << 16
	ix := New(Config{})
	for w := range workers {
		name := fmt.Sprint("w", w)
		ix.AddWorker(name, "bench-model", benchBS)
		for c := 0; c < perWorker/512; c++ {
			toks, hs := benchChain(w*1000+c, 512)
			ix.Apply(name, vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: benchBS}}})
		}
	}
	if n := ix.Stats().Entries; n != workers*perWorker {
		b.Fatalf("%d entries, want %d", n, workers*perWorker)
	}
	var buf bytes.Buffer
	if err := ix.WriteSnapshot(&buf, nil); err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(buf.Len()))
		var out bytes.Buffer
		for b.Loop() {
			out.Reset()
			if err := ix.WriteSnapshot(&out, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode+load", func(b *testing.B) {
		b.SetBytes(int64(buf.Len()))
		for b.Loop() {
			s, err := ReadSnapshot(bytes.NewReader(buf.Bytes()))
			if err != nil {
				b.Fatal(err)
			}
			dst := New(Config{})
			for w := range workers {
				dst.AddWorker(fmt.Sprint("w", w), "bench-model", benchBS)
			}
			if st := dst.LoadSnapshot(s); st.Entries != workers*perWorker {
				b.Fatalf("loaded %d entries", st.Entries)
			}
		}
	})
}
