package kvindex

// MatchResult is one worker's answer to a Match: how many leading blocks of
// the prompt it holds on the device tier, and how many it holds in all.
type MatchResult struct {
	// Worker is the worker id (the candidate at the same position).
	Worker string
	// Blocks is the number of consecutive leading prompt blocks held.
	Blocks int
	// Cached is the worker's total device blocks, for tie-breaks.
	Cached int
	// HostBlocks and DiskBlocks count the blocks right after the device
	// prefix that the worker holds in host memory, then on other media
	// (disk): offloaded KV that loads faster than it computes. The
	// approximate index leaves them 0.
	HostBlocks, DiskBlocks int
	// Known is false when the index has no such worker; Blocks and Cached
	// are then 0.
	Known bool
	// Stale is true while the worker's view may be out of date (a sequence
	// gap or restart, or an unknown parent) and it has not resynced.
	Stale bool
}

// reset overwrites r with a fresh result, field by field. Assigning a
// composite literal through the slice instead builds it on the stack with
// narrow stores and copies it with wide loads, which stall on store
// forwarding: for 64 candidates that was most of Match's fixed cost.
func (r *MatchResult) reset(worker string, known, stale bool, cached int) {
	r.Worker = worker
	r.Blocks = 0
	r.Cached = cached
	r.HostBlocks = 0
	r.DiskBlocks = 0
	r.Known = known
	r.Stale = stale
}

// Matcher is what the scorer needs from an index: Index (events) and
// Approx (the router's own decisions) both provide it.
type Matcher interface {
	// Match writes into out (resized to len(candidates), reusing its
	// storage) one result per candidate, aligned with candidates, and
	// returns it. A nil candidates slice means every known worker.
	Match(hashes []uint64, candidates []string, out []MatchResult) []MatchResult
}

var (
	_ Matcher = (*Index)(nil)
	_ Matcher = (*Approx)(nil)
)

// workerRef is where a candidate's bit lives; idx is -1 for an unknown
// candidate. prefixClosed says that the worker holds every block's parent
// (links.go), so walkJump may stride through its blocks.
type workerRef struct {
	idx          int
	word         int
	bit          uint64
	prefixClosed bool
}

// matchWords is the walk shared by Index and Approx: given out, one result
// per candidate with Worker, Known, Stale and Cached already set, and refs
// aligned with it, it sets every known candidate's Blocks. words[w] holds
// the sets of dense worker indices 64w..64w+63; nslots bounds the indices.
// The caller holds the read lock that guards words.
func matchWords(words []*bitTable, nslots int, hashes []uint64, refs []workerRef, out []MatchResult) {
	var aliveBuf, closedBuf [4]uint64
	alive, closed := aliveBuf[:0], closedBuf[:0]
	for range words {
		alive = append(alive, 0)
		closed = append(closed, 0)
	}
	for _, ref := range refs {
		if ref.idx < 0 {
			continue
		}
		if ref.prefixClosed {
			closed[ref.word] |= ref.bit
		} else {
			alive[ref.word] |= ref.bit
		}
	}
	var depthBuf [64]int32
	depth := depthBuf[:0]
	if nslots > len(depthBuf) {
		depth = make([]int32, 0, nslots)
	}
	depth = depth[:nslots]
	for wd, a := range alive {
		d := depth[wd*64 : min(nslots, wd*64+64)]
		if a != 0 {
			walk(words[wd], hashes, a, d)
		}
		if c := closed[wd]; c != 0 {
			walkJump(words[wd], hashes, c, d)
		}
	}
	for i, ref := range refs {
		if ref.idx >= 0 {
			out[i].Blocks = int(depth[ref.idx])
		}
	}
}

// refBuf is room for the refs of a typical candidate list on the stack.
type refBuf [64]workerRef

// refs returns a slice of n refs, in b when it fits.
func (b *refBuf) refs(n int) []workerRef {
	if n > len(b) {
		return make([]workerRef, n)
	}
	return b[:n]
}
