package kvindex

import "math/bits"

// links is what lets Match skip through a worker's blocks instead of
// probing each (walkJump): for every device block the worker holds (a
// distinct router hash) the router hash of its parent, and for every router
// hash how many held blocks have it as parent. orphans counts the held
// blocks whose parent is not held. A router hash names its whole prefix
// (it chains from the parent's), so while orphans is 0 a worker that holds
// a prompt's block p holds blocks 0..p as well: its holdings along a
// prompt are a prefix, and probing every stride-th block finds where that
// prefix ends up to one stride.
//
// Engines evict a request's tail before its head, so orphans is 0 almost
// always; a worker with orphans (an interior block removed, a chain stored
// under a parent held only off the device) is walked block by block until
// they are gone.
type links struct {
	t linkTable
	// orphans: held blocks with a parent that is not held.
	orphans int
	// unknown: the holdings came from a snapshot, which carries no
	// parents; the worker is walked until its next purge.
	unknown bool
}

// newLinks returns a worker's empty links; without Config.JumpSearch they
// are never kept, and the worker is walked block by block.
func (ix *Index) newLinks() links {
	if !ix.cfg.JumpSearch {
		return links{unknown: true}
	}
	return links{t: newLinkTable()}
}

// prefixClosed reports whether every block the worker holds has its parent
// held too, so that walkJump's answer for it is exact.
func (l *links) prefixClosed() bool { return l.orphans == 0 && !l.unknown }

// held records that the worker now holds router hash r (its bit was just
// set) with the given parent (0: r starts a chain).
func (l *links) held(r, parent uint64) {
	if l.unknown {
		return
	}
	if parent != 0 {
		p := l.t.upsert(parent)
		p.kids++
		if !p.held {
			l.orphans++
		}
	}
	s := l.t.upsert(r)
	s.held, s.parent = true, parent
	// r's held children had no held parent until now.
	l.orphans -= int(s.kids)
}

// dropped records that the worker no longer holds router hash r (its bit
// was just cleared).
func (l *links) dropped(r uint64) {
	if l.unknown {
		return
	}
	i := l.t.find(r)
	if i < 0 {
		return
	}
	s := &l.t.slots[i]
	parent := s.parent
	l.orphans += int(s.kids)
	if s.kids == 0 {
		l.t.deleteAt(i)
	} else {
		s.held, s.parent = false, 0
	}
	if parent == 0 {
		return
	}
	if i = l.t.find(parent); i < 0 {
		return
	}
	p := &l.t.slots[i]
	p.kids--
	if !p.held {
		l.orphans--
		if p.kids == 0 {
			l.t.deleteAt(i)
		}
	}
}

// touch loads the slots of routers, as oaTable.touch.
func (l *links) touch(routers []uint64) uint64 {
	if l.unknown {
		return 0
	}
	return l.t.touch(routers)
}

func (l *links) bytes() int { return len(l.t.slots) * linkSlotBytes }

// linkTable maps a router hash to its linkSlot: open addressing with
// linear probing and backward-shift deletion, as oaTable, with 24-byte
// slots so that a block's parent and child count share one cache line.
// A key is present while it is held or has held children.
type linkTable struct {
	slots []linkSlot
	count int
}

type linkSlot struct {
	key    uint64
	parent uint64 // 0: a root, or not held
	kids   uint32 // held blocks whose parent is key
	held   bool
}

const (
	linkSlotBytes = 24
	linkMinSize   = 64
	linkMaxLoad   = 75 // percent
)

func newLinkTable() linkTable { return linkTable{slots: make([]linkSlot, linkMinSize)} }

func (t *linkTable) home(key uint64) int {
	hi, _ := bits.Mul64(key*0x9e3779b97f4a7c15, uint64(len(t.slots)))
	return int(hi)
}

func (t *linkTable) find(key uint64) int {
	n := len(t.slots)
	for i := t.home(key); ; {
		k := t.slots[i].key
		if k == key {
			return i
		}
		if k == 0 {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// upsert returns key's slot, inserting an empty one if absent. The
// pointer is valid until the next upsert or delete.
func (t *linkTable) upsert(key uint64) *linkSlot {
	if (t.count+1)*100 > len(t.slots)*linkMaxLoad {
		t.resize(len(t.slots) + len(t.slots)/2)
	}
	n := len(t.slots)
	for i := t.home(key); ; {
		s := &t.slots[i]
		if s.key == key {
			return s
		}
		if s.key == 0 {
			s.key = key
			t.count++
			return s
		}
		if i++; i == n {
			i = 0
		}
	}
}

// deleteAt empties slot i, moving back the later entries of its probe run
// that could no longer be reached across the hole (see oaTable.deleteAt).
func (t *linkTable) deleteAt(i int) {
	t.count--
	n := len(t.slots)
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		s := t.slots[j]
		if s.key == 0 {
			break
		}
		h := t.home(s.key)
		if (i < j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = linkSlot{}
	if len(t.slots) > linkMinSize && t.count*300 < len(t.slots)*linkMaxLoad {
		t.resize(max(linkMinSize, len(t.slots)/2))
	}
}

func (t *linkTable) resize(size int) {
	old := t.slots
	t.slots = make([]linkSlot, size)
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].key != 0 {
			if i++; i == size {
				i = 0
			}
		}
		t.slots[i] = s
	}
}

func (t *linkTable) touch(keys []uint64) (sink uint64) {
	for _, k := range keys {
		sink ^= t.slots[t.home(k)].key
	}
	return sink
}
