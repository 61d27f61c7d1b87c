package kvindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkChains checks chainTable's invariants: every router hash has at
// most one cell; exactly the first cell of each chain is in the table; a
// cell that does not start its chain follows its parent's (parent gives a
// block's parent hash, 0 for none: nil skips the check); counts agree;
// refs and pins are what want says they should be (nil skips that); a
// chain no off-device entry pins ends with a held cell; the forks agree
// with the links (and with parent: a linked chain's first block follows
// the cell it is linked to, a chain neither linked nor unlinked starts at
// the root), and the unlinked chains are counted.
func checkChains(t *testing.T, c *chainTable, parent func(uint64) uint64, want func(id uint32) (refs, pins int64)) {
	t.Helper()
	seen := map[uint64]bool{}
	cells, held := 0, 0
	free := map[uint32]bool{}
	for _, id := range c.free {
		free[id] = true
	}
	for id, ch := range c.chains {
		if free[uint32(id)] {
			if ch.cells != nil || ch.refs != 0 {
				t.Fatalf("freed chain %d keeps %d cells", id, len(ch.cells))
			}
			continue
		}
		if len(ch.cells) == 0 || ch.refs == 0 {
			t.Fatalf("chain %d of %d cells, %d refs, is not free", id, len(ch.cells), ch.refs)
		}
		if want != nil {
			if refs, pins := want(uint32(id)); refs != ch.refs || pins != ch.pins {
				t.Fatalf("chain %d counts %d refs and %d pins, want %d and %d", id, ch.refs, ch.pins, refs, pins)
			}
		}
		for off, cl := range ch.cells {
			if seen[cl.hash] {
				t.Fatalf("hash %d has two cells", cl.hash)
			}
			seen[cl.hash] = true
			ref, ok := c.start(cl.hash)
			if off == 0 && (!ok || ref != cellRef(uint32(id), 0)) {
				t.Fatalf("chain %d starts with %d, the table says %x (%v)", id, cl.hash, ref, ok)
			}
			if off > 0 && ok {
				t.Fatalf("hash %d, cell %d of chain %d, is in the table", cl.hash, off, id)
			}
			if off > 0 && parent != nil && parent(cl.hash) != ch.cells[off-1].hash {
				t.Fatalf("hash %d follows %d, not its parent %d", cl.hash, ch.cells[off-1].hash, parent(cl.hash))
			}
			if cl.set != 0 {
				held++
			}
		}
		if ch.pins == 0 && ch.cells[len(ch.cells)-1].set == 0 {
			t.Fatalf("chain %d ends with an empty cell", id)
		}
		cells += len(ch.cells)
	}
	unlinked, forkCap := 0, 0
	for id, ch := range c.chains {
		forkCap += cap(ch.forks)
		if free[uint32(id)] {
			if ch.forks != nil || ch.up != 0 || ch.unlinked {
				t.Fatalf("freed chain %d keeps links", id)
			}
			continue
		}
		if ch.unlinked {
			unlinked++
			if ch.up != 0 {
				t.Fatalf("chain %d is unlinked and linked to chain %d", id, ch.up-1)
			}
		}
		first := ch.cells[0].hash
		switch {
		case ch.up != 0:
			pid := ch.up - 1
			if free[pid] || int(ch.upAt) >= len(c.chains[pid].forks) || c.chains[pid].forks[ch.upAt].id != uint32(id) {
				t.Fatalf("chain %d is linked to chain %d as fork %d, which does not list it", id, pid, ch.upAt)
			}
			off := c.chains[pid].forks[ch.upAt].off
			if int(off) >= len(c.chains[pid].cells) {
				t.Fatalf("chain %d is linked to cell %d of chain %d, which has %d", id, off, pid, len(c.chains[pid].cells))
			}
			if parent != nil && parent(first) != c.chains[pid].cells[off].hash {
				t.Fatalf("chain %d (first block %d, parent %d) is linked to cell %d of chain %d, block %d", id, first, parent(first), off, pid, c.chains[pid].cells[off].hash)
			}
		case !ch.unlinked && parent != nil && parent(first) != 0:
			t.Fatalf("chain %d starts with %d, whose parent is %d, and is neither linked nor unlinked", id, first, parent(first))
		}
		for i, f := range ch.forks {
			if k := c.chains[f.id]; free[f.id] || k.up != uint32(id)+1 || k.upAt != uint32(i) {
				t.Fatalf("chain %d lists chain %d as fork %d, which is linked to %d as %d", id, f.id, i, k.up, k.upAt)
			}
		}
	}
	if unlinked != c.unlinked || forkCap != c.forkCap {
		t.Fatalf("%d chains are unlinked and forks have room for %d, counted %d and %d", unlinked, forkCap, c.unlinked, c.forkCap)
	}
	if cells != c.cells || len(c.chains)-len(free) != c.count || held != c.held {
		t.Fatalf("%d cells (%d held) in %d chains, counted %d (%d held), table %d", cells, held, len(c.chains)-len(free), c.cells, c.held, c.count)
	}
}

// TestChainTableAgreesWithMap drives a chainTable as the index does
// (runs of blocks stored after their parent, in batches, by workers and
// off the device; blocks placed as a snapshot load does, looked up among
// every cell; entries dropped in any order, interior ones included)
// against maps of entries, checking its invariants, every block's set,
// and that walkChains agrees with looking every block up.
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
	parentOf := map[uint64]uint64{}
	for d := 0; d < docs; d++ {
		for j := 1; j < docLen; j++ {
			parentOf[hash(d, j)] = hash(d, j-1)
		}
	}
	c := newChainTable(0)
	// An entry holds a cell: a worker slot's device entry, or (slot -1)
	// an off-device pin. entries lists them, count how many of each.
	type entry struct {
		hash uint64
		slot int
		at   uint64
	}
	var entries []entry
	count := map[[2]uint64]int{}
	at := map[uint64]uint64{} // a held block's cell
	sets := func(h uint64) []int {
		var out []int
		for s := 0; s < nslots; s++ {
			if count[[2]uint64{h, uint64(s)}] > 0 {
				out = append(out, s)
			}
		}
		return out
	}
	hold := func(h, ref uint64, s int) {
		if s < 0 {
			c.pin(ref)
		} else if had := c.hold(ref, s); had != (count[[2]uint64{h, uint64(s)}] > 0) {
			t.Fatalf("hold(%d, %d) had=%v", h, s, had)
		}
		entries = append(entries, entry{h, s, ref})
		count[[2]uint64{h, uint64(s)}]++
		at[h] = ref
	}
	drop := func(i int) {
		e := entries[i]
		entries[i] = entries[len(entries)-1]
		entries = entries[:len(entries)-1]
		k := [2]uint64{e.hash, uint64(e.slot)}
		count[k]--
		if e.slot < 0 {
			c.unpin(e.at)
		} else {
			c.release(e.at, e.slot, count[k] == 0)
		}
		if count[k] == 0 {
			delete(count, k)
		}
		for _, o := range entries {
			if o.hash == e.hash {
				return
			}
		}
		delete(at, e.hash)
	}
	slot := func() int {
		switch r := rng.IntN(12); {
		case r == 0:
			return -1 // off the device
		case r < 4:
			return rng.IntN(nslots)
		}
		return rng.IntN(6) // inline sets, mostly
	}
	walks, deep := 0, 0
	for step := 0; step < 30000; step++ {
		switch p := rng.IntN(100); {
		case p < 45: // an event: a run stored after its parent, or from the root
			d, from := rng.IntN(docs), rng.IntN(docLen)
			if rng.IntN(3) == 0 {
				from = 0
			}
			ref, hasRef := uint64(0), false
			if from > 0 {
				if ref, hasRef = at[hash(d, from-1)]; !hasRef {
					continue // the parent is unknown: the index drops such events
				}
			}
			to := min(docLen, from+1+rng.IntN(12))
			s := slot()
			c.begin(false)
			for j := from; j < to; j++ {
				ref, hasRef = c.place(hash(d, j), ref, hasRef, to-j), true
				hold(hash(d, j), ref, s)
			}
			c.end()
		case p < 50: // a snapshot's blocks, in no order and with no parents
			s := slot()
			all := c.cellsByHash()
			c.begin(true)
			for k := rng.IntN(10); k >= 0; k-- {
				h := hash(rng.IntN(docs), rng.IntN(docLen))
				ref, ok := all[h]
				if !ok {
					ref = c.placeUnlinked(h)
					all[h] = ref
				}
				hold(h, ref, s)
			}
			c.end()
		default: // entries dropped, interior ones included, in a batch or not
			if len(entries) == 0 {
				continue
			}
			batch := rng.IntN(2) == 0
			if batch {
				c.begin(false)
			}
			for k := rng.IntN(6); k >= 0 && len(entries) > 0; k-- {
				drop(rng.IntN(len(entries)))
			}
			if batch {
				c.end()
			}
		}
		if step%500 != 0 {
			continue
		}
		checkChains(t, c, func(h uint64) uint64 { return parentOf[h] }, func(id uint32) (refs, pins int64) {
			for _, e := range entries {
				if uint32(e.at>>32) == id {
					refs++
					if e.slot < 0 {
						pins++
					}
				}
			}
			return refs, pins
		})
		all := c.cellsByHash()
		for d := 0; d < docs; d++ {
			for j := 0; j < docLen; j++ {
				h := hash(d, j)
				v := uint64(0)
				if ref, ok := all[h]; ok {
					v = c.cell(ref).set
				}
				if got, want := members(&c.holderSets, v), sets(h); !slices.Equal(got, want) {
					t.Fatalf("step %d: set of %d = %v, want %v", step, h, got, want)
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
				prompt[rng.IntN(len(prompt))] = uint64(1000 + rng.IntN(docs*docLen))
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
					for want[s] < int32(len(prompt)) && count[[2]uint64{prompt[want[s]], uint64(s)}] > 0 {
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
	if deep < walks/20 {
		t.Fatalf("only %d of %d walks went past 3 blocks: the test does not exercise chains", deep, walks)
	}
	// Drop everything: every chain is freed and the table empties.
	for len(entries) > 0 {
		drop(len(entries) - 1)
	}
	checkChains(t, c, nil, nil)
	if c.count != 0 || c.cells != 0 || c.held != 0 || len(c.free) != len(c.chains) {
		t.Fatalf("emptied table keeps %d keys, %d cells, %d of %d chains", c.count, c.cells, len(c.chains)-len(c.free), len(c.chains))
	}
}

// TestChainsFollowStores pins the layout: a prompt stored in three
// events, each after the last, is one chain, and a second worker storing a
// prefix of it and then a turn of its own adds one chain; interior
// removals leave a chain whole, removing its tail cuts it.
func TestChainsFollowStores(t *testing.T) {
	c := newChainTable(0)
	refs := map[uint64]uint64{}
	store := func(slot int, parent uint64, hashes ...uint64) {
		at, hasAt := refs[parent]
		for i, h := range hashes {
			at, hasAt = c.place(h, at, hasAt, len(hashes)-i), true
			c.hold(at, slot)
			refs[h] = at
		}
	}
	store(0, 0, 1, 2, 3, 4)
	store(0, 4, 5, 6)
	store(0, 6, 7, 8, 9)
	if len(c.chains) != 1 || len(c.chains[0].cells) != 9 || c.count != 1 {
		t.Fatalf("three stores after one another make %d chains, the first of %d cells, %d in the table", len(c.chains), len(c.chains[0].cells), c.count)
	}
	store(1, 0, 1, 2, 3)
	store(1, 3, 14, 15)
	if len(c.chains) != 2 || len(c.chains[0].cells) != 9 || len(c.chains[1].cells) != 2 || c.count != 2 {
		t.Fatalf("a second worker's turn makes %d chains, %d in the table", len(c.chains), c.count)
	}
	c.release(refs[5], 0, true)
	c.release(refs[9], 0, true)
	c.release(refs[8], 0, true)
	if n := len(c.chains[0].cells); n != 7 {
		t.Fatalf("after removing 5, 9 and 8 the chain has %d cells, want 7", n)
	}
	checkChains(t, c, nil, nil)
}

// TestChainGrowsGeometrically: a chain extended one block per event, as
// an engine storing each block it fills while decoding does, is copied a
// logarithmic number of times, not once per block, and keeps at most a
// quarter of its cells spare.
func TestChainGrowsGeometrically(t *testing.T) {
	c := newChainTable(0)
	at := c.place(1, 0, false, 1)
	c.hold(at, 0)
	copies := 0
	for h := uint64(2); h <= 20000; h++ {
		before := cap(c.chains[0].cells)
		at = c.place(h, at, true, 1)
		c.hold(at, 0)
		if cap(c.chains[0].cells) != before {
			copies++
		}
	}
	if n := len(c.chains[0].cells); n != 20000 || len(c.chains) != 1 {
		t.Fatalf("%d chains, the first of %d cells; want one of 20000", len(c.chains), n)
	}
	if copies > 50 {
		t.Fatalf("20000 single-block stores copied the chain %d times", copies)
	}
	if spare := cap(c.chains[0].cells) - 20000; spare > 20000/4+1 {
		t.Fatalf("%d spare cells after 20000", spare)
	}
	checkChains(t, c, nil, nil)
}

// TestForkLinksFollowCutsFreesAndSnapshots: a chain made after a cell of
// another is linked to it as a fork, and stays linked while that cell
// does; cutting the cell or freeing its chain (whose number is then
// reused) unlinks the fork, and storing the fork's first block after its
// parent again finds the fork, with no second cell, and links it again.
// Blocks placed without a parent, as a snapshot's are, stay unlinked until
// stored after their parent or as a root.
func TestForkLinksFollowCutsFreesAndSnapshots(t *testing.T) {
	c := newChainTable(0)
	parentOf := map[uint64]uint64{}
	refs := map[uint64]uint64{}
	store := func(slot int, parent uint64, hashes ...uint64) {
		t.Helper()
		at, hasAt := refs[parent]
		if parent != 0 && !hasAt {
			t.Fatalf("parent %d has no cell", parent)
		}
		prev := parent
		for i, h := range hashes {
			parentOf[h], prev = prev, h
			at, hasAt = c.place(h, at, hasAt, len(hashes)-i), true
			c.hold(at, slot)
			refs[h] = at
		}
	}
	drop := func(slot int, hashes ...uint64) {
		for _, h := range hashes {
			c.release(refs[h], slot, true)
		}
	}
	check := func(what string, unlinked int) {
		t.Helper()
		checkChains(t, c, func(h uint64) uint64 { return parentOf[h] }, nil)
		if c.unlinked != unlinked {
			t.Fatalf("%s: %d chains unlinked, want %d", what, c.unlinked, unlinked)
		}
	}
	store(0, 0, 1, 2, 3, 4) // chain 0
	store(1, 0, 1, 2)
	store(1, 2, 10, 11) // chain 1, a fork of chain 0 at cell 1
	check("a fork", 0)
	if b := c.chains[1]; b.up != 1 || len(c.chains[0].forks) != 1 || c.chains[0].forks[0] != (fork{id: 1, off: 1}) {
		t.Fatalf("chain 1 is linked to %d, chain 0's forks are %v", b.up, c.chains[0].forks)
	}
	drop(0, 4, 3)
	check("a cut that keeps the parent's cell", 0)
	if len(c.chains[0].cells) != 2 || c.chains[1].up != 1 {
		t.Fatalf("chain 0 has %d cells, chain 1 is linked to %d", len(c.chains[0].cells), c.chains[1].up)
	}
	drop(0, 2)
	drop(1, 2)
	check("a cut of the parent's cell", 1)
	if len(c.chains[0].cells) != 1 || c.chains[1].up != 0 {
		t.Fatalf("chain 0 has %d cells, chain 1 is linked to %d", len(c.chains[0].cells), c.chains[1].up)
	}
	store(0, 1, 2)
	store(0, 2, 10)
	check("the fork stored again after its parent", 0)
	if refs[10] != cellRef(1, 0) || len(c.chains) != 2 {
		t.Fatalf("block 10 is at %x, %d chains", refs[10], len(c.chains))
	}
	// Chain 0 freed while its fork is held: the fork is unlinked, and the
	// next chain made takes number 0.
	drop(0, 1, 2)
	drop(1, 1)
	check("the parent's chain freed", 1)
	store(2, 0, 20, 21, 22)
	if refs[20] != cellRef(0, 0) {
		t.Fatalf("a new chain is at %x, not in freed chain 0", refs[20])
	}
	check("its number reused", 1)
	store(3, 0, 1, 2)
	store(3, 2, 10)
	check("the fork stored after its parent's new cell", 0)
	if refs[10] != cellRef(1, 0) || c.chains[1].up != uint32(refs[2]>>32)+1 {
		t.Fatalf("block 10 is at %x, linked to %d; its parent is at %x", refs[10], c.chains[1].up, refs[2])
	}
	// A snapshot's blocks: one under a known block, one a root.
	parentOf[30], parentOf[40] = 22, 0
	refs[30], refs[40] = c.placeUnlinked(30), c.placeUnlinked(40)
	c.hold(refs[30], 4)
	c.hold(refs[40], 4)
	check("a snapshot's blocks", 2)
	store(2, 22, 30)
	check("a snapshot's block stored after its parent", 1)
	store(2, 0, 40, 41)
	check("a snapshot's block stored as a root", 0)
	if len(c.chains[uint32(refs[40]>>32)].cells) != 2 {
		t.Fatalf("block 41 did not go after 40")
	}
}
