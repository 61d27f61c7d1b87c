package bench

import (
	"container/list"
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// Ideal holds the reference hit rates a workload allows, in the same unit
// as the measured one (cached prompt tokens ÷ prompt tokens).
type Ideal struct {
	// Infinite is the hit rate of one cache that never evicts: every
	// prefix seen before is a hit.
	Infinite float64 `json:"infinite"`
	// Fleet is the hit rate of one LRU cache holding the fleet's total
	// capacity in blocks: what a router could reach if the fleet were one
	// big worker (it ignores blocks pinned by running requests, so it is a
	// bound, not a promise).
	Fleet float64 `json:"fleet_capacity"`
	// FleetBlocks is the capacity used for Fleet.
	FleetBlocks int `json:"fleet_blocks"`
	// Requests counts the prompts the rates were computed from.
	Requests int `json:"requests"`
}

// IdealHitRates replays the workload's prompts, in arrival order, through
// an infinite cache and through an LRU of capacity blocks of blockSize
// tokens, with vLLM's rules: full blocks only, matched as a chained prefix,
// and at least one prompt token always recomputed. Items without known
// prompts are skipped; ok is false when none had one.
func IdealHitRates(w *Workload, blockSize, capacity int) (Ideal, bool) {
	return IdealOf(func(yield func([]int32)) {
		for _, fl := range w.Flows {
			for _, it := range fl.Items {
				if it.Prompt != nil {
					yield(it.Prompt)
				}
			}
		}
	}, blockSize, capacity)
}

// IdealOf is IdealHitRates over the prompts each calls yield with, in
// arrival order, for workloads that build their prompts on the fly.
func IdealOf(each func(yield func(prompt []int32)), blockSize, capacity int) (Ideal, bool) {
	inf := map[uint64]struct{}{}
	lru := newBlockLRU(capacity)
	var total, infHit, lruHit, n int
	var hashes []uint64
	each(func(prompt []int32) {
		n++
		total += len(prompt)
		hashes = chainHashes(hashes[:0], prompt, blockSize)
		maxHit := (len(prompt) - 1) / blockSize
		k := 0
		for k < maxHit {
			if _, ok := inf[hashes[k]]; !ok {
				break
			}
			k++
		}
		infHit += k * blockSize
		k = 0
		for k < maxHit && lru.has(hashes[k]) {
			k++
		}
		lruHit += k * blockSize
		// Touch the tail first so that, as in vLLM's free queue, a
		// prompt's last blocks are evicted before its first ones.
		for i := len(hashes) - 1; i >= 0; i-- {
			inf[hashes[i]] = struct{}{}
			lru.touch(hashes[i])
		}
	})
	if n == 0 || total == 0 {
		return Ideal{}, false
	}
	return Ideal{
		Infinite: float64(infHit) / float64(total), Fleet: float64(lruHit) / float64(total),
		FleetBlocks: capacity, Requests: n,
	}, true
}

// chainHashes appends the chained hash of every full block of tokens.
func chainHashes(dst []uint64, tokens []int32, blockSize int) []uint64 {
	var prev uint64
	buf := make([]byte, 8+4*blockSize)
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		binary.LittleEndian.PutUint64(buf, prev)
		for j, t := range tokens[i : i+blockSize] {
			binary.LittleEndian.PutUint32(buf[8+4*j:], uint32(t))
		}
		prev = xxh3.Hash(buf)
		dst = append(dst, prev)
	}
	return dst
}

// blockLRU is a fixed-capacity LRU set of block hashes.
type blockLRU struct {
	cap   int
	order *list.List // front = most recent
	byKey map[uint64]*list.Element
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{cap: capacity, order: list.New(), byKey: map[uint64]*list.Element{}}
}

func (l *blockLRU) has(h uint64) bool {
	_, ok := l.byKey[h]
	return ok
}

// touch inserts h or makes it the most recent, evicting the least recent
// block when full.
func (l *blockLRU) touch(h uint64) {
	if l.cap <= 0 {
		return
	}
	if e, ok := l.byKey[h]; ok {
		l.order.MoveToFront(e)
		return
	}
	if l.order.Len() >= l.cap {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.byKey, old.Value.(uint64))
	}
	l.byKey[h] = l.order.PushFront(h)
}
