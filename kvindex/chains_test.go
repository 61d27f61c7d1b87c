package kvindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkChains checks chainTable's invariants: every cell's hash maps to
// its place and to no other cell, counts agree, a chain ends with a held
// cell, and no chain is kept with nothing held.
func checkChains(t *testing.T, c *chainTable) {
	t.Helper()
	seen := map[uint64]bool{}
	cells, held := 0, 0
	free := map[uint32]bool{}
	for _, id := range c.free {
		free[id] = true
	}
	for id, ch := range c.chains {
		if free[uint32(id)] {
			if ch.cells != nil || ch.held != 0 {
				t.Fatalf("freed chain %d keeps %d cells", id, len(ch.cells))
			}
			continue
		}
		if len(ch.cells) == 0 {
			t.Fatalf("chain %d is empty and not free", id)
		}
		n := int32(0)
		for off, cl := range ch.cells {
			if seen[cl.hash] {
				t.Fatalf("hash %d has two cells", cl.hash)
			}
			seen[cl.hash] = true
			if ref, ok := c.locate(cl.hash); !ok || ref != cellRef(uint32(id), off) {
				t.Fatalf("hash %d sits at %d/%d, the table says %x (%v)", cl.hash, id, off, ref, ok)
			}
			if cl.set != 0 {
				n++
			}
		}
		if n != ch.held || n == 0 {
			t.Fatalf("chain %d holds %d cells, counts %d", id, n, ch.held)
		}
		if ch.cells[len(ch.cells)-1].set == 0 {
			t.Fatalf("chain %d ends with an empty cell", id)
		}
		cells += len(ch.cells)
		held += int(n)
	}
	if cells != c.cells || cells != c.count || held != c.held {
		t.Fatalf("%d cells (%d held), counted %d (%d held), table %d", cells, held, c.cells, c.held, c.count)
	}
}

// TestChainTableAgreesWithMap drives a chainTable as the index does
// (runs of blocks stored after their parent, in batches; blocks placed
// with no parent, as a snapshot load does; removals anywhere, of blocks
// held and not) against a map of holder sets, checking its invariants and
// that walkChains agrees with looking every block up.
func TestChainTableAgreesWithMap(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { testChainTable(t, seed) })
	}
}

func testChainTable(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 5))
	const docs, docLen, nslots = 20, 40, 70
	// Documents share prefixes, as prompts share system prompts: doc d
	// is doc d%4's first d*2 blocks, then its own.
	hash := func(d, j int) uint64 {
		if b := d % 4; d >= 4 && j < d*2%docLen {
			d = b
		}
		return uint64(d*docLen+j) + 1
	}
	c := newChainTable(0)
	ref := map[uint64]map[int]bool{}
	set := func(h uint64, s int, on bool) {
		if on {
			if ref[h] == nil {
				ref[h] = map[int]bool{}
			}
			ref[h][s] = true
		} else if delete(ref[h], s); len(ref[h]) == 0 {
			delete(ref, h)
		}
	}
	slot := func() int {
		if rng.IntN(3) == 0 {
			return rng.IntN(nslots)
		}
		return rng.IntN(6) // inline sets, mostly
	}
	walks, deep := 0, 0
	for step := 0; step < 30000; step++ {
		switch p := rng.IntN(100); {
		case p < 45: // an event: a run chained after its parent
			d, from := rng.IntN(docs), rng.IntN(docLen)
			to := min(docLen, from+1+rng.IntN(12))
			s := slot()
			var at uint64
			hasAt := false
			if from > 0 && rng.IntN(8) != 0 { // else its parent is off the device
				at, hasAt = c.locate(hash(d, from-1))
			}
			c.begin(false)
			for j := from; j < to; j++ {
				h := hash(d, j)
				at, hasAt = c.place(h, at, hasAt, to-j), true
				if had := c.addAt(at, s); had != ref[h][s] {
					t.Fatalf("step %d: add(%d, %d) had=%v", step, h, s, had)
				}
				set(h, s, true)
			}
			c.end()
		case p < 50: // a snapshot's blocks, in no order and with no parents
			s := slot()
			c.begin(true)
			for k := rng.IntN(10); k >= 0; k-- {
				h := hash(rng.IntN(docs), rng.IntN(docLen))
				if had := c.add(h, s); had != ref[h][s] {
					t.Fatalf("step %d: add(%d, %d) had=%v", step, h, s, had)
				}
				set(h, s, true)
			}
			c.end()
		default: // removals, interior ones included, in a batch or not
			s := slot()
			batch := rng.IntN(2) == 0
			if batch {
				c.begin(false)
			}
			d, j := rng.IntN(docs), rng.IntN(docLen)
			for k := rng.IntN(6); k >= 0 && j < docLen; k-- {
				h := hash(d, j)
				if had := c.remove(h, s); had != ref[h][s] {
					t.Fatalf("step %d: remove(%d, %d) had=%v", step, h, s, had)
				}
				set(h, s, false)
				j++
			}
			if batch {
				c.end()
			}
		}
		if step%500 != 0 {
			continue
		}
		checkChains(t, c)
		for d := 0; d < docs; d++ {
			for j := 0; j < docLen; j++ {
				h := hash(d, j)
				if got, want := members(&c.holderSets, c.get(h)), sortedKeys(ref[h]); !slices.Equal(got, want) {
					t.Fatalf("step %d: get(%d) = %v, want %v", step, h, got, want)
				}
			}
		}
		// walkChains against a lookup of every block in turn.
		for trial := 0; trial < 20; trial++ {
			d := rng.IntN(docs)
			prompt := make([]uint64, 1+rng.IntN(docLen))
			for j := range prompt {
				prompt[j] = hash(d, j)
			}
			if rng.IntN(4) == 0 { // a prompt that leaves its document
				prompt[rng.IntN(len(prompt))] = hash(rng.IntN(docs), rng.IntN(docLen))
			}
			cands := make([]uint64, (nslots+63)/64)
			for s := 0; s < nslots; s++ {
				if rng.IntN(1+trial%4*8) == 0 {
					cands[s>>6] |= 1 << (s & 63)
				}
			}
			var want, got [nslots]int32
			for s := 0; s < nslots; s++ {
				if cands[s>>6]&(1<<(s&63)) != 0 {
					for want[s] < int32(len(prompt)) && ref[prompt[want[s]]][s] {
						want[s]++
					}
				}
			}
			alive := aliveOf(slices.Clone(cands))
			walkChains(c, prompt, &alive, 0, got[:])
			for s := 0; s < nslots; s++ {
				if cands[s>>6]&(1<<(s&63)) != 0 {
					if got[s] != want[s] {
						t.Fatalf("step %d: slot %d walked %d deep into %v, want %d", step, s, got[s], prompt, want[s])
					}
					walks++
					if got[s] > 3 {
						deep++
					}
				}
			}
		}
	}
	checkChains(t, c)
	if deep < walks/20 {
		t.Fatalf("only %d of %d walks went past 3 blocks: the test does not exercise chains", deep, walks)
	}
	// Remove everything: every chain is freed and the table empties.
	for h, set := range ref {
		for s := range set {
			c.remove(h, s)
		}
	}
	checkChains(t, c)
	if c.count != 0 || c.cells != 0 || len(c.free) != len(c.chains) {
		t.Fatalf("emptied table keeps %d keys, %d cells, %d of %d chains", c.count, c.cells, len(c.chains)-len(c.free), len(c.chains))
	}
}

// TestChainsFollowStores pins the layout: a prompt stored in three
// events, each after the last, is one chain, and a second worker storing
// a prefix of it and then a different turn adds one chain, not one cell
// per block to the table's lookups.
func TestChainsFollowStores(t *testing.T) {
	c := newChainTable(0)
	store := func(slot int, parent uint64, hashes ...uint64) {
		at, hasAt := c.locate(parent)
		for i, h := range hashes {
			at, hasAt = c.place(h, at, hasAt, len(hashes)-i), true
			c.addAt(at, slot)
		}
	}
	store(0, 0, 1, 2, 3, 4)
	store(0, 4, 5, 6)
	store(0, 6, 7, 8, 9)
	if len(c.chains) != 1 || len(c.chains[0].cells) != 9 {
		t.Fatalf("three stores after one another make %d chains, the first of %d cells", len(c.chains), len(c.chains[0].cells))
	}
	store(1, 0, 1, 2, 3)
	store(1, 3, 14, 15)
	if len(c.chains) != 2 || len(c.chains[0].cells) != 9 || len(c.chains[1].cells) != 2 {
		t.Fatalf("a second worker's turn makes %d chains", len(c.chains))
	}
	// Interior removals leave the chain whole; removing its tail cuts it.
	c.remove(5, 0)
	c.remove(9, 0)
	c.remove(8, 0)
	if n := len(c.chains[0].cells); n != 7 {
		t.Fatalf("after removing 5, 9 and 8 the chain has %d cells, want 7", n)
	}
	checkChains(t, c)
}
