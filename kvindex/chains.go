package kvindex

import "unsafe"

// chainTable is the Index's block table: for every router block hash the
// set of worker slots holding it, kept in chains of cells (router hash,
// holder set) in the order blocks were stored after their parents: the
// blocks one BlockStored event adds start a chain, or extend the one whose
// last cell is their parent. Only a chain's first cell is in the hash
// table; a prompt's walk reaches the others in order, comparing its next
// hash with the next cell's. A 512-block prompt stored in a few events is
// a few probes and a sequential read of 8 KB, instead of 512 probes at
// random places, and storing a block that extends a chain writes no table
// entry.
//
// That is exact because of two invariants:
//
//   - a router hash has at most one cell;
//   - a cell that does not start its chain follows its parent's cell.
//
// Router hashes chain over the whole prefix, so a block's parent is unique
// and a block that exists either follows its parent's cell or starts a
// chain: place, given the parent's cell, looks in those two places before
// it makes a cell, and walkChains looks in them for a prompt's next
// block. (A prompt's first block has no parent: it starts a chain if it
// has a cell.) Callers reach a cell through its place (cellRef), which
// stays valid while they hold it.
//
// Each chain counts the entries that hold it (workers' engine keys on the
// device tier, and off the device, whose blocks get cells too so that
// their children can be placed), and is freed with its table entry when
// none is left. A cell whose set empties stays, with an empty set ("held
// by nobody"), while its chain is held, so that the chain is not cut in
// two by an interior removal; trailing empty cells are cut off when no
// off-device entry holds the chain. It is not safe for concurrent writes;
// Index guards it.
//
// A block stored right after its parent, where the parent's cell ends
// its chain, either has no cell yet or starts a chain of its own. To
// spare that case the table probe, each chain lists its forks: the chains
// whose first block's parent has its cell in it (a chain made by place
// with a parent is linked to it). When the parent's chain has no forks,
// and no chain is unlinked (a chain whose first block's parent is unknown
// or lost its cell: a snapshot's blocks, which come without parents, or a
// fork whose parent's cell was cut or freed), the block has no cell, and
// place appends it without a probe. A probe that finds an unlinked chain
// whose parent it knows links it again.
type chainTable struct {
	oaTable    // the router hash of each chain's first cell -> its place
	holderSets // the big sets and a batch's changes
	chains     []chain
	free       []uint32 // numbers of freed chains
	unlinked   int      // chains whose unlinked is set
	forkCap    int      // the capacity of all chains' forks
	held       int      // cells whose set is not empty
	cells      int      // cells in all chains
	cellCap    int      // their capacity
}

// A cell is one block of a chain.
type cell struct {
	hash uint64 // router hash
	set  uint64 // holder set (table.go's lanes), 0 when nobody holds it
}

type chain struct {
	cells []cell
	refs  int64 // entries holding a cell of the chain (a fleet's worth may exceed 2^31)
	pins  int64 // of those, off-device ones
	forks []fork
	// up is 1 + the number of the chain holding the cell of the first
	// block's parent, 0 when the chain is not linked to one; upAt is its
	// place in that chain's forks.
	up, upAt uint32
	// unlinked: the first block may have a parent whose cell the chain
	// is not linked to (counted in chainTable.unlinked).
	unlinked bool
}

// A fork is a chain whose first block's parent has its cell at off.
type fork struct{ id, off uint32 }

// A cellRef is a cell's place: its chain's number in the high 32 bits,
// its offset in the low ones.
func cellRef(ch uint32, off int) uint64 { return uint64(ch)<<32 | uint64(uint32(off)) }

// chainMaxLoad: the table holds one key per chain, few beside the
// blocks, and a prompt's walk probes it once per chain it crosses.
const chainMaxLoad = 60

func newChainTable(hint int) *chainTable {
	return &chainTable{oaTable: newOATable(hint, chainMaxLoad), holderSets: newHolderSets()}
}

// cell returns the cell at ref.
func (c *chainTable) cell(ref uint64) *cell { return &c.chains[ref>>32].cells[uint32(ref)] }

// start returns the place of key's cell if it starts a chain.
func (c *chainTable) start(key uint64) (ref uint64, ok bool) {
	if i := c.find(key); i >= 0 && key != 0 { // 0 marks an empty slot
		return c.slots[i].val, true
	}
	return 0, false
}

// place returns the place of key's cell, making one if key has none.
// parent is the place of the cell of key's parent block, when hasParent:
// key's cell is right after it or starts a chain; without a parent key
// is the first block of a prompt. A cell it makes goes right after parent
// if that ends its chain, else starts a new chain with room for hint
// cells. The caller must hold or pin a cell it makes before the table
// changes again.
func (c *chainTable) place(key, parent uint64, hasParent bool, hint int) uint64 {
	if hasParent {
		pid, next := uint32(parent>>32), int(uint32(parent))+1
		ch := &c.chains[pid]
		if next < len(ch.cells) {
			if ch.cells[next].hash == key {
				return cellRef(pid, next)
			}
		} else {
			// The parent ends its chain: key's cell, if any, starts a
			// fork of it, and there is none to look for when the chain has
			// no forks and every chain is linked.
			if c.unlinked > 0 || len(ch.forks) > 0 {
				if ref, ok := c.start(key); ok {
					c.adopt(uint32(ref>>32), parent, true)
					return ref
				}
			}
			c.cells++
			if len(ch.cells) == cap(ch.cells) {
				// Room for the rest of the event, and at least a quarter
				// more: an engine that stores a generation's blocks one
				// event each (vLLM while decoding) must not copy the chain
				// every time.
				c.cellCap -= cap(ch.cells)
				grown := make([]cell, len(ch.cells), len(ch.cells)+max(hint, len(ch.cells)/4, 1))
				copy(grown, ch.cells)
				ch.cells = grown
				c.cellCap += cap(grown)
			}
			ch.cells = append(ch.cells, cell{hash: key})
			return cellRef(pid, next)
		}
	}
	s, found := c.insert(key)
	if found {
		c.adopt(uint32(s.val>>32), parent, hasParent)
		return s.val
	}
	id := c.newChain(key, hint)
	if hasParent {
		c.link(id, parent)
	}
	s.val = cellRef(id, 0)
	return s.val
}

// placeUnlinked is place for a block whose parent is unknown (a
// snapshot's): a chain it makes is unlinked.
func (c *chainTable) placeUnlinked(key uint64) uint64 {
	s, found := c.insert(key)
	if found {
		return s.val
	}
	id := c.newChain(key, 1)
	c.chains[id].unlinked = true
	c.unlinked++
	s.val = cellRef(id, 0)
	return s.val
}

// newChain makes a chain of key's cell, with room for hint cells, and
// returns its number; the caller puts it in the table.
func (c *chainTable) newChain(key uint64, hint int) uint32 {
	c.cells++
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
	return id
}

// adopt is told that chain id starts with a block whose parent's cell is
// at parent (when hasParent) or that has no parent: an unlinked chain is
// linked to it, or marked as a root.
func (c *chainTable) adopt(id uint32, parent uint64, hasParent bool) {
	ch := &c.chains[id]
	if !ch.unlinked {
		return
	}
	ch.unlinked = false
	c.unlinked--
	if hasParent {
		c.link(id, parent)
	}
}

// link records chain id as a fork of the chain of the cell at parent.
func (c *chainTable) link(id uint32, parent uint64) {
	pid := uint32(parent >> 32)
	p := &c.chains[pid]
	c.chains[id].up, c.chains[id].upAt = pid+1, uint32(len(p.forks))
	c.forkCap -= cap(p.forks)
	p.forks = append(p.forks, fork{id: id, off: uint32(parent)})
	c.forkCap += cap(p.forks)
}

// cutFork drops fork i of chain pid, which becomes unlinked.
func (c *chainTable) cutFork(pid uint32, i int) {
	p := &c.chains[pid]
	f := p.forks[i]
	c.dropFork(p, i)
	k := &c.chains[f.id]
	k.up, k.unlinked = 0, true
	c.unlinked++
}

// dropFork removes fork i from p's forks, moving the last one into its
// place.
func (c *chainTable) dropFork(p *chain, i int) {
	last := len(p.forks) - 1
	if i != last {
		p.forks[i] = p.forks[last]
		c.chains[p.forks[i].id].upAt = uint32(i)
	}
	p.forks = p.forks[:last]
}

// hold records one more device entry of worker slot at the cell at ref:
// slot joins its set, and reports whether it was there already (another
// engine key of the worker holds the same block).
func (c *chainTable) hold(ref uint64, slot int) (had bool) {
	c.chains[ref>>32].refs++
	cl := c.cell(ref)
	was := cl.set
	if c.addTo(&cl.set, slot) {
		return true
	}
	if was == 0 {
		c.held++
	}
	return false
}

// release drops one device entry of worker slot at the cell at ref; when
// last (the worker's last engine key for the block) slot leaves its set.
func (c *chainTable) release(ref uint64, slot int, last bool) {
	ch := &c.chains[ref>>32]
	ch.refs--
	if last {
		cl := c.cell(ref)
		if c.removeFrom(&cl.set, slot) && cl.set == 0 {
			c.held--
		}
	}
	c.settle(ref)
}

// pin records an off-device entry at the cell at ref, unpin drops one.
func (c *chainTable) pin(ref uint64) {
	ch := &c.chains[ref>>32]
	ch.refs++
	ch.pins++
}

func (c *chainTable) unpin(ref uint64) {
	ch := &c.chains[ref>>32]
	ch.refs--
	ch.pins--
	c.settle(ref)
}

// settle frees the chain of ref if nothing holds it, else cuts its
// trailing empty cells if no off-device entry holds the chain (a device
// entry's cell is never empty).
func (c *chainTable) settle(ref uint64) {
	id := uint32(ref >> 32)
	ch := &c.chains[id]
	switch {
	case ch.refs == 0:
		c.deleteAt(c.find(ch.cells[0].hash))
		c.cells -= len(ch.cells)
		c.cellCap -= cap(ch.cells)
		for i := len(ch.forks) - 1; i >= 0; i-- {
			c.cutFork(id, i)
		}
		if ch.up != 0 {
			c.dropFork(&c.chains[ch.up-1], int(ch.upAt))
		}
		if ch.unlinked {
			c.unlinked--
		}
		c.forkCap -= cap(ch.forks)
		c.chains[id] = chain{}
		c.free = append(c.free, id)
	case ch.pins == 0 && ch.cells[len(ch.cells)-1].set == 0:
		n := len(ch.cells) - 1
		for ch.cells[n-1].set == 0 { // the first cell holds if nothing else does
			n--
		}
		c.cells -= len(ch.cells) - n
		ch.cells = ch.cells[:n]
		// Forks whose parent's cell is cut lose their link.
		for i := len(ch.forks) - 1; i >= 0; i-- {
			if int(ch.forks[i].off) >= n {
				c.cutFork(id, i)
			}
		}
	}
}

// touchCells loads the cells at refs so that their cache misses overlap
// instead of being paid one by one by the updates that follow. The result
// only keeps the loads from being optimised away.
func (c *chainTable) touchCells(refs []uint64) (sink uint64) {
	for _, ref := range refs {
		sink ^= c.cell(ref).hash
	}
	return sink
}

// cellsByHash maps every cell's router hash to its place: what a
// snapshot's blocks, which come without parents, are looked up in.
func (c *chainTable) cellsByHash() map[uint64]uint64 {
	m := make(map[uint64]uint64, c.cells)
	for id, ch := range c.chains {
		for off, cl := range ch.cells {
			m[cl.hash] = cellRef(uint32(id), off)
		}
	}
	return m
}

// bytes is the memory of the table, the chains and the big sets.
func (c *chainTable) bytes() int {
	return c.oaTable.bytes() + c.cellCap*16 + cap(c.chains)*int(unsafe.Sizeof(chain{})) + c.forkCap*int(unsafe.Sizeof(fork{})) + c.sets.bytes()
}

// walkChains is walk over a chainTable: it sets depth[s] for every member s
// of alive to base plus the number of leading hashes whose set contains s.
// hashes are a prompt's, its first block first: that block starts a chain
// if it has a cell. walkChains reads the chain on while its hashes are the
// prompt's, and looks the next hash up in the table where they part (a
// block not right after its parent starts a chain); a hash the table lacks
// ends the walk. Its cost is one
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
		ref, ok := c.start(hashes[i])
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
		hs := hashes[i : i+len(cells)]
		j := 0
		for ; j < len(cells); j++ {
			cl := &cells[j]
			if cl.hash != hs[j] {
				break
			}
			if cl.set != last {
				last = cl.set
				if !alive.step(&c.holderSets, cl.set, base+int32(i+j), depth) {
					return
				}
			}
		}
		i += j
	}
	alive.finish(base+int32(n), depth)
}
