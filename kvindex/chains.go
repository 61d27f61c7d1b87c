package kvindex

// chainTable is the Index's block table: for every router block hash the
// set of worker slots holding it, like holderTable, but with the sets kept
// in chains rather than in the table. A chain is a run of cells (router
// hash, holder set), each block's cell right after its parent's where the
// order of stores allows: the blocks one BlockStored event adds start a
// chain, or extend the one whose last cell is their parent. The table maps
// every hash to its cell. A lookup of a prompt probes the table once per
// chain it crosses and reads the rest of each chain in order, comparing
// the prompt's next hash with the next cell's: a 512-block prompt stored
// in a few events is a few probes and a sequential read of 8 KB, instead
// of 512 probes at random places.
//
// Exactness does not depend on how blocks are grouped: every hash has one
// cell (the table finds it), so a cell whose hash equals the prompt's next
// hash is that block whichever chain it sits in. A cell whose set empties
// stays (with an empty set, "held by nobody") while others in its chain
// are held, so a chain is not cut in two by an interior removal; trailing
// empty cells are cut off, and a chain whose every cell is empty is freed.
// It is not safe for concurrent writes; Index guards it.
type chainTable struct {
	oaTable    // router hash -> cell (cellRef)
	holderSets // the big sets and a batch's changes
	chains     []chain
	free       []uint32 // numbers of freed chains
	held       int      // cells whose set is not empty
	cells      int      // cells in all chains (their capacity is in bytes)
	cellCap    int
}

// A cell is one block of a chain.
type cell struct {
	hash uint64 // router hash
	set  uint64 // holder set (table.go's lanes), 0 when nobody holds it
}

type chain struct {
	cells []cell
	held  int32 // cells whose set is not empty
}

// A cellRef is a cell's place: its chain's number in the high 32 bits,
// its offset in the low ones.
func cellRef(ch uint32, off int) uint64 { return uint64(ch)<<32 | uint64(uint32(off)) }

// chainMaxLoad: only a prompt's first block and the first of each chain
// it crosses are looked up in the table, so buckets overflowing cost
// lookups little, and a fuller table saves memory.
const chainMaxLoad = 75

func newChainTable(hint int) *chainTable {
	return &chainTable{oaTable: newOATable(hint, chainMaxLoad), holderSets: newHolderSets()}
}

// cell returns the cell at ref.
func (c *chainTable) cell(ref uint64) *cell { return &c.chains[ref>>32].cells[uint32(ref)] }

// locate returns the place of key's cell.
func (c *chainTable) locate(key uint64) (ref uint64, ok bool) {
	if i := c.find(key); i >= 0 && key != 0 { // 0 marks an empty slot
		return c.slots[i].val, true
	}
	return 0, false
}

// get returns the set of key, or 0.
func (c *chainTable) get(key uint64) uint64 {
	if ref, ok := c.locate(key); ok {
		return c.cell(ref).set
	}
	return 0
}

// has reports whether key's set contains slot.
func (c *chainTable) has(key uint64, slot int) bool { return c.contains(c.get(key), slot) }

// place returns the place of key's cell, making one if key has none: right
// after the cell at parent (when hasParent) if that is the last of its
// chain, else at the start of a new chain with room for hint cells.
func (c *chainTable) place(key, parent uint64, hasParent bool, hint int) uint64 {
	if hasParent {
		ch := &c.chains[parent>>32]
		if next := int(uint32(parent)) + 1; next < len(ch.cells) && ch.cells[next].hash == key {
			return cellRef(uint32(parent>>32), next)
		}
	}
	s, inserted := c.upsert(key)
	if !inserted {
		return s.val
	}
	var ref uint64
	if hasParent && int(uint32(parent))+1 == len(c.chains[parent>>32].cells) {
		ch := &c.chains[parent>>32]
		c.cellCap -= cap(ch.cells)
		ch.cells = append(ch.cells, cell{hash: key})
		c.cellCap += cap(ch.cells)
		ref = cellRef(uint32(parent>>32), len(ch.cells)-1)
	} else {
		var id uint32
		if n := len(c.free); n > 0 {
			id = c.free[n-1]
			c.free = c.free[:n-1]
		} else {
			id = uint32(len(c.chains))
			c.chains = append(c.chains, chain{})
		}
		cells := make([]cell, 1, max(hint, 1))
		cells[0].hash = key
		c.chains[id] = chain{cells: cells}
		c.cellCap += cap(cells)
		ref = cellRef(id, 0)
	}
	c.cells++
	s.val = ref // s is still key's slot: nothing moved the table since upsert
	return ref
}

// addAt puts slot into the set of the cell at ref and reports whether it
// was already there.
func (c *chainTable) addAt(ref uint64, slot int) (had bool) {
	cl := c.cell(ref)
	was := cl.set
	if c.addTo(&cl.set, slot) {
		return true
	}
	if was == 0 {
		c.held++
		c.chains[ref>>32].held++
	}
	return false
}

// add puts slot into key's set, making key a chain of its own if new, and
// reports whether slot was there already.
func (c *chainTable) add(key uint64, slot int) (had bool) {
	return c.addAt(c.place(key, 0, false, 1), slot)
}

// remove takes slot out of key's set and reports whether it was there. A
// cell left empty at the end of its chain is cut off with the empty ones
// before it; a chain left with no held cell is freed.
func (c *chainTable) remove(key uint64, slot int) (had bool) {
	ref, ok := c.locate(key)
	if !ok {
		return false
	}
	cl := c.cell(ref)
	if !c.removeFrom(&cl.set, slot) {
		return false
	}
	if cl.set != 0 {
		return true
	}
	c.held--
	id := uint32(ref >> 32)
	ch := &c.chains[id]
	if ch.held--; ch.held == 0 {
		c.cut(ch, 0)
		c.chains[id] = chain{}
		c.free = append(c.free, id)
		return true
	}
	if int(uint32(ref)) == len(ch.cells)-1 {
		n := len(ch.cells) - 1
		for n > 0 && ch.cells[n-1].set == 0 {
			n--
		}
		c.cut(ch, n)
	}
	return true
}

// cut deletes the cells of ch from offset from on, every one empty, and
// their hashes from the table.
func (c *chainTable) cut(ch *chain, from int) {
	for _, cl := range ch.cells[from:] {
		c.deleteAt(c.find(cl.hash))
	}
	c.cells -= len(ch.cells) - from
	if from == 0 {
		c.cellCap -= cap(ch.cells)
		ch.cells = nil
		return
	}
	ch.cells = ch.cells[:from]
}

// bytes is the memory of the table, the chains and the big sets.
func (c *chainTable) bytes() int {
	return c.oaTable.bytes() + c.cellCap*16 + cap(c.chains)*32 + c.sets.bytes()
}

// walkChains is walk over a chainTable: it sets depth[s] for every member s
// of alive to base plus the number of leading hashes whose set contains s.
// It looks up the first hash in the table, then reads that cell's chain on
// while the chain's hashes are the prompt's, and looks up the next hash
// where they part; a hash the table lacks ends the walk. Its cost is one
// probe per chain crossed plus the cells read, and one step per change of
// set, whatever the size of the fleet.
func walkChains(c *chainTable, hashes []uint64, alive *aliveSet, base int32, depth []int32) {
	if alive.n == 0 {
		return
	}
	n := len(hashes)
	// A prompt that parts from every chain early probes one of its first
	// blocks next: have their buckets on the way.
	var at [matchChunk]int
	c.prefetch(hashes[:min(n, matchChunk)], at[:])
	last := ^uint64(0) // no set is all ones
	for i := 0; i < n; {
		ref, ok := c.locate(hashes[i])
		if !ok {
			alive.step(&c.holderSets, 0, base+int32(i), depth)
			return
		}
		cells := c.chains[ref>>32].cells[uint32(ref):]
		if e := i + len(cells); e < n {
			// Where the chain ends, if the prompt follows it that far,
			// is where the next probe is.
			c.prefetch(hashes[e:e+1], at[:1])
		}
		cells = cells[:min(len(cells), n-i)]
		for j := range cells {
			cl := &cells[j]
			if cl.hash != hashes[i] {
				break
			}
			if cl.set != last {
				last = cl.set
				if !alive.step(&c.holderSets, cl.set, base+int32(i), depth) {
					return
				}
			}
			i++
		}
	}
	alive.finish(base+int32(n), depth)
}
