package kvindex

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// refModel is the obvious implementation the index must agree with: per
// worker, the set of engine hashes held per medium, and each engine hash's
// router hash (known to the generator, which builds blocks from documents).
type refModel struct {
	gpu, cpu map[string]map[uint64]bool
	router   map[uint64]uint64 // engine key -> router hash
}

func newRefModel() *refModel {
	return &refModel{gpu: map[string]map[uint64]bool{}, cpu: map[string]map[uint64]bool{}, router: map[uint64]uint64{}}
}

func (m *refModel) holds(w string, key uint64) bool { return m.gpu[w][key] || m.cpu[w][key] }

func (m *refModel) apply(w string, ev vllmwire.Event) {
	if m.gpu[w] == nil {
		m.gpu[w], m.cpu[w] = map[uint64]bool{}, map[uint64]bool{}
	}
	switch e := ev.(type) {
	case vllmwire.BlockStored:
		if e.ParentBlockHash != nil && !m.holds(w, e.ParentBlockHash.Key()) {
			return
		}
		set := m.gpu[w]
		if e.Medium != nil && *e.Medium == vllmwire.MediumCPU {
			set = m.cpu[w]
		}
		for _, h := range e.BlockHashes {
			set[h.Key()] = true
		}
	case vllmwire.BlockRemoved:
		set := m.gpu[w]
		if e.Medium != nil && *e.Medium == vllmwire.MediumCPU {
			set = m.cpu[w]
		}
		for _, h := range e.BlockHashes {
			delete(set, h.Key())
		}
	case vllmwire.AllBlocksCleared:
		m.gpu[w], m.cpu[w] = map[uint64]bool{}, map[uint64]bool{}
	}
}

func (m *refModel) match(prompt []uint64, w string) (blocks, cached int) {
	held := map[uint64]bool{}
	for key := range m.gpu[w] {
		held[m.router[key]] = true
	}
	for blocks < len(prompt) && held[prompt[blocks]] {
		blocks++
	}
	return blocks, len(held)
}

// randomStream drives an Index and the reference model with the same random
// events: stores that chain from random points of a family of documents
// sharing prefixes, removes (some of hashes never stored), offloads to
// CPU, clears; and compares every worker's Match on random prompts.
func TestIndexAgreesWithReferenceModelOnRandomStreams(t *testing.T) {
	// Five workers: sets mostly inline; seventy: big sets over two words,
	// shared by the blocks of an event and copied when one changes.
	for _, fleet := range []struct{ workers, steps int }{{5, 4000}, {70, 12000}} {
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprint(fleet.workers, "workers/seed", seed), func(t *testing.T) {
				testAgainstReference(t, seed, fleet.workers, fleet.steps)
			})
		}
	}
}

func testAgainstReference(t *testing.T, seed uint64, nworkers, steps int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	const docs, docBlocks = 12, 24
	// Documents share prefixes: doc d copies the first d%5*3 blocks of doc 0.
	tokens := make([][]uint32, docs)
	for d := range tokens {
		tokens[d] = doc(d, docBlocks)
		copy(tokens[d], tokens[0][:(d%5)*3*testBS])
	}
	seed0 := Seed(testModel, "", "")
	routers := make([][]uint64, docs)
	ref := newRefModel()
	engine := func(d, j int) vllmwire.EngineHash {
		// Engine hashes are a function of content, like vLLM's.
		return vllmwire.HashUint(routers[d][j] ^ 0xabcdef)
	}
	for d := range routers {
		routers[d] = HashBlocks(seed0, tokens[d], testBS, nil)
		for j, r := range routers[d] {
			ref.router[engine(d, j).Key()] = r
		}
	}
	ix := New(Config{})
	var workers []string
	for i := range nworkers {
		workers = append(workers, fmt.Sprint("w", i))
		ix.AddWorker(workers[i], testModel, testBS)
	}
	var out []MatchResult
	fixed := append(slices.Clone(workers), "nobody")
	nonzero := 0
	for step := 0; step < steps; step++ {
		w := workers[rng.IntN(len(workers))]
		if rng.IntN(200) == 0 {
			// A capacity learnt (or changed) mid-stream resizes the
			// worker's table under its blocks and changes no answer.
			ix.Reserve(w, rng.IntN(5000))
		}
		var ev vllmwire.Event
		switch p := rng.IntN(100); {
		case p < 55:
			d, from := rng.IntN(docs), rng.IntN(docBlocks)
			to := min(docBlocks, from+1+rng.IntN(6))
			e := vllmwire.BlockStored{BlockSize: testBS, TokenIDs: tokens[d][from*testBS : to*testBS]}
			for j := from; j < to; j++ {
				e.BlockHashes = append(e.BlockHashes, engine(d, j))
			}
			if from > 0 {
				e.ParentBlockHash = ptr(engine(d, from-1))
			}
			if rng.IntN(5) == 0 {
				e.Medium = ptr(vllmwire.MediumCPU)
			}
			ev = e
		case p < 97:
			e := vllmwire.BlockRemoved{}
			for k := rng.IntN(5); k >= 0; k-- {
				d, j := rng.IntN(docs), rng.IntN(docBlocks)
				e.BlockHashes = append(e.BlockHashes, engine(d, j))
			}
			if rng.IntN(5) == 0 {
				e.Medium = ptr(vllmwire.MediumCPU)
			}
			ev = e
		default:
			ev = vllmwire.AllBlocksCleared{}
		}
		ref.apply(w, ev)
		ix.Apply(w, vllmwire.EventBatch{Events: []vllmwire.Event{ev}})

		if step%7 == 0 {
			d := rng.IntN(docs)
			prompt := routers[d][:1+rng.IntN(docBlocks)]
			cands := slices.Clone(workers)
			rng.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
			cands = append(cands[:1+rng.IntN(len(cands))], "nobody")
			if step%2 == 0 {
				// The same list as last time: what Match remembers of it
				// must have followed the events since.
				cands = fixed
			}
			out = ix.Match(prompt, cands, out)
			for i, r := range out {
				w := cands[i]
				wb, wc := ref.match(prompt, w)
				if wb > 0 {
					nonzero++
				}
				if int(r.Blocks) != wb || int(r.Cached) != wc {
					t.Fatalf("step %d: %s matched %d cached %d, reference %d cached %d",
						step, w, r.Blocks, r.Cached, wb, wc)
				}
			}
		}
	}
	if nonzero < 100 {
		t.Fatalf("only %d non-empty matches: the stream does not exercise the index", nonzero)
	}
	s := ix.Stats()
	entries := 0
	for _, w := range workers {
		_, c := ref.match(nil, w)
		entries += c
	}
	if s.Entries != entries {
		t.Fatalf("index holds %d entries, reference %d", s.Entries, entries)
	}
}

// TestConcurrentApplyAndMatch runs writers (one per worker, as the consumer
// does), readers and worker churn at once; run it with -race. Afterwards
// every writer's final state must be exactly what it applied last.
func TestConcurrentApplyAndMatch(t *testing.T) {
	ix := New(Config{})
	const writers, rounds = 4, 300
	for i := 0; i < writers; i++ {
		ix.AddWorker(fmt.Sprint("w", i), testModel, testBS)
	}
	prompt := promptHashes(1, 16)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			w := fmt.Sprint("w", i)
			for r := 0; r < rounds; r++ {
				ix.Apply(w, vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 8), storeEv(1, 8, 16)}})
				ix.Apply(w, vllmwire.EventBatch{Events: []vllmwire.Event{removeEv(1, 15-r%16)}})
				if r%50 == 0 {
					ix.Apply(w, vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}}})
				}
			}
			ix.Apply(w, vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.AllBlocksCleared{}, storeEv(1, 0, 4+i)}})
		}(i)
	}
	var readers sync.WaitGroup
	for i := 0; i < 3; i++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var out []MatchResult
			cands := []string{"w0", "w1", "w2", "w3", "churn"}
			for {
				select {
				case <-stop:
					return
				default:
				}
				out = ix.Match(prompt, cands, out)
				for _, r := range out {
					if int(r.Blocks) < 0 || int(r.Blocks) > len(prompt) || int(r.Blocks) > int(r.Cached) {
						t.Errorf("impossible result %+v", r)
						return
					}
				}
				_ = ix.Stats()
			}
		}()
	}
	readers.Add(1)
	go func() {
		defer readers.Done()
		for r := 0; ; r++ {
			select {
			case <-stop:
				return
			default:
			}
			ix.AddWorker("churn", testModel, testBS)
			ix.Apply("churn", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3)}})
			ix.RemoveWorker("churn")
		}
	}()
	wg.Wait()
	close(stop)
	readers.Wait()
	res := ix.Match(prompt, []string{"w0", "w1", "w2", "w3", "churn"}, nil)
	for i := 0; i < writers; i++ {
		if int(res[i].Blocks) != 4+i || int(res[i].Cached) != 4+i {
			t.Errorf("w%d ends with %+v, want %d blocks", i, res[i], 4+i)
		}
	}
	if res[4].Known {
		t.Error("removed worker still known")
	}
}

// members decodes a holder set of t, sorted.
func members(t *holderSets, v uint64) []int {
	var out []int
	if isBig(v) {
		for i, w := range t.sets.set(uint32(v)) {
			for ; w != 0; w &= w - 1 {
				out = append(out, i*64+bits.TrailingZeros64(w))
			}
		}
		return out
	}
	for ; v != 0; v >>= laneBits {
		out = append(out, int(v&laneMask)-1)
	}
	slices.Sort(out)
	return out
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestHolderTableAgreesWithMap checks the block table, including
// backward-shift deletion across growth and shrinking, sets going big and
// back inline, and slots too large for a lane, against Go maps.
func TestHolderTableAgreesWithMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	tb := newHolderTable(0)
	ref := map[uint64]map[int]bool{}
	slot := func(step int) int {
		switch r := rng.IntN(100); {
		case r == 0 && step > 190000:
			return maxLane // one past what a lane holds (late: it widens every big set)
		case r < 10:
			return 64 + rng.IntN(100) // a second and third word
		default:
			return rng.IntN(8)
		}
	}
	shared := false // whether any check saw blocks sharing a set
	check := func(step int) {
		if tb.count != len(ref) {
			t.Fatalf("step %d: count %d, want %d", step, tb.count, len(ref))
		}
		sharers := map[uint32]int32{}
		for k := uint64(1); k <= 5000; k++ {
			v := tb.get(k)
			if got, want := members(&tb.holderSets, v), sortedKeys(ref[k]); !slices.Equal(got, want) {
				t.Fatalf("step %d: get(%d) = %v, want %v", step, k, got, want)
			}
			if isBig(v) {
				sharers[uint32(v)]++
				if n := len(ref[k]); int(tb.sets.count[uint32(v)]) != n || n <= shrinkAt && tb.sets.inlinable(uint32(v)) {
					t.Fatalf("step %d: big set of %d counts %d", step, n, tb.sets.count[uint32(v)])
				}
			} else if len(ref[k]) > inlineCap {
				t.Fatalf("step %d: %d holders inline", step, len(ref[k]))
			}
			for s := range ref[k] {
				if !tb.has(k, s) {
					t.Fatalf("step %d: has(%d, %d) false", step, k, s)
				}
			}
		}
		if len(sharers)+len(tb.sets.free) != len(tb.sets.count) || len(tb.sets.pending) != 0 {
			t.Fatalf("step %d: %d big sets live, %d free, %d pending, %d made", step, len(sharers), len(tb.sets.free), len(tb.sets.pending), len(tb.sets.count))
		}
		for id, n := range sharers {
			shared = shared || n > 1
			if tb.sets.refs[id] != n {
				t.Fatalf("step %d: set %d shared by %d blocks, counts %d", step, id, n, tb.sets.refs[id])
			}
		}
		// Match's path: prefetch, resolve and finish a chunk at a time.
		keys := make([]uint64, matchChunk)
		for k0 := uint64(1); k0 <= 5000; k0 += matchChunk {
			keys = keys[:0]
			for k := k0; k < k0+matchChunk && k <= 5000; k++ {
				keys = append(keys, k)
			}
			var at [matchChunk]int
			var got [matchChunk]uint64
			var over [matchChunk]uint8
			tb.prefetch(keys, at[:])
			nover := tb.resolve(keys, at[:], got[:], &over)
			tb.finish(keys, at[:], got[:], over[:nover])
			for i, k := range keys {
				if got[i] != tb.get(k) {
					t.Fatalf("step %d: resolve(%d) = %x, want %x", step, k, got[i], tb.get(k))
				}
			}
		}
	}
	// A prompt of 200 blocks that ten workers store in turn, one event
	// each: from the fifth on, its blocks share one set.
	for s := 0; s < 10; s++ {
		tb.begin(false)
		for k := uint64(1); k <= 200; k++ {
			tb.add(k, s)
			if ref[k] == nil {
				ref[k] = map[int]bool{}
			}
			ref[k][s] = true
		}
		tb.end()
	}
	if v := tb.get(1); !isBig(v) || tb.sets.refs[uint32(v)] != 200 {
		t.Fatalf("a run stored by ten workers holds set %x, shared %d times", v, tb.sets.refs[uint32(v)])
	}
	// Few distinct keys, many collisions: keys from a small range with
	// low-entropy values stress probe runs.
	for step := 0; step < 200000; step++ {
		key := uint64(rng.IntN(5000)) + 1
		if step == 100000 { // shrink phase: drop every key above 300
			for k, set := range ref {
				if k > 300 {
					for s := range set {
						tb.remove(k, s)
					}
					delete(ref, k)
				}
			}
		}
		if step >= 100000 {
			key = uint64(rng.IntN(300)) + 1
		}
		s := slot(step)
		if step%50 == 0 {
			// A batch: one slot added to (or taken from) a run of keys,
			// as an event does, or to keys in any order, as a purge does;
			// runs whose sets were equal come out sharing one set.
			add, bulk := rng.IntN(2) == 0, rng.IntN(2) == 0
			n := rng.IntN(40)
			tb.begin(bulk)
			keys := 5000
			if step >= 100000 {
				keys = 300
			}
			for j := 0; j < n; j++ {
				k := (key+uint64(j)-1)%uint64(keys) + 1
				if bulk {
					k = uint64(rng.IntN(keys)) + 1
				}
				if add {
					if had := tb.add(k, s); had != ref[k][s] {
						t.Fatalf("step %d: batch add(%d, %d) had=%v", step, k, s, had)
					}
					if ref[k] == nil {
						ref[k] = map[int]bool{}
					}
					ref[k][s] = true
				} else {
					if had := tb.remove(k, s); had != ref[k][s] {
						t.Fatalf("step %d: batch remove(%d, %d) had=%v", step, k, s, had)
					}
					if delete(ref[k], s); len(ref[k]) == 0 {
						delete(ref, k)
					}
				}
			}
			tb.end()
			continue
		}
		if rng.IntN(2) == 0 {
			had := tb.add(key, s)
			if had != ref[key][s] {
				t.Fatalf("step %d: add(%d, %d) had=%v", step, key, s, had)
			}
			if ref[key] == nil {
				ref[key] = map[int]bool{}
			}
			ref[key][s] = true
		} else {
			had := tb.remove(key, s)
			if had != ref[key][s] {
				t.Fatalf("step %d: remove(%d, %d) had=%v", step, key, s, had)
			}
			if delete(ref[key], s); len(ref[key]) == 0 {
				delete(ref, key)
			}
		}
		if step%997 == 0 {
			check(step)
		}
	}
	check(-1)
	if !shared {
		t.Error("no two blocks ever shared a set")
	}
	if len(tb.slots) > 4096 {
		t.Fatalf("table did not shrink: %d slots for %d keys", len(tb.slots), tb.count)
	}
}

// TestWalkAgreesWithGet checks walk, which prefetches chunks ahead and stops
// early, against looking every hash up in turn, on a crowded table (many
// keys past their home bucket) with prompts shorter and longer than the
// chunks it keeps in flight, and holder sets inline and big, walked with
// few and many candidates.
func TestWalkAgreesWithGet(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	tb := newHolderTable(0)
	const nkeys, nslots = 3000, 140
	for k := uint64(1); k <= nkeys; k++ {
		many := rng.IntN(3) == 0
		for s := 0; s < nslots; s++ {
			if many && rng.IntN(64) != 0 || !many && s%37 == int(k%37) { // so that walks often go deep
				tb.add(k, s)
			}
		}
	}
	for trial := 0; trial < 2000; trial++ {
		n := rng.IntN(5 * matchChunk * walkAhead)
		hashes := make([]uint64, n)
		for i := range hashes {
			hashes[i] = uint64(rng.IntN(nkeys+nkeys/300)) + 1 // a few not in the table
		}
		cands := make([]uint64, (nslots+63)/64)
		density := 1 + rng.IntN(64)
		for s := 0; s < nslots; s++ {
			if rng.IntN(density) == 0 {
				cands[s>>6] |= 1 << (s & 63)
			}
		}
		isCand := func(s int) bool { return cands[s>>6]&(1<<(s&63)) != 0 }
		var want [nslots]int32
		live := map[int]bool{}
		for s := 0; s < nslots; s++ {
			if isCand(s) {
				live[s] = true
			}
		}
		for j, h := range hashes {
			v := tb.get(h)
			for s := range live {
				if !tb.contains(v, s) {
					want[s] = int32(j)
					delete(live, s)
				}
			}
		}
		for s := range live {
			want[s] = int32(n)
		}
		var got [nslots]int32
		base := int32(rng.IntN(3))
		alive := aliveOf(slices.Clone(cands))
		walk(tb, hashes, &alive, base, got[:])
		for s := 0; s < nslots; s++ {
			if isCand(s) && got[s] != want[s]+base {
				t.Fatalf("trial %d (%d hashes): slot %d walked %d deep, want %d", trial, n, s, got[s]-base, want[s])
			}
		}
	}
}

// TestU64TableAgreesWithMap checks the engine-hash table, key 0 included,
// through growth, churn and shrinking.
func TestU64TableAgreesWithMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tb := newU64Table()
	ref := map[uint64]uint64{}
	keyRange := 6000
	for step := 0; step < 150000; step++ {
		if step == 100000 {
			keyRange = 200
			for k := range ref {
				if k >= 200 {
					tb.remove(k)
					delete(ref, k)
				}
			}
		}
		key := uint64(rng.IntN(keyRange))
		switch rng.IntN(3) {
		case 0, 1:
			val := rng.Uint64()
			old, had := tb.put(key, val)
			wantOld, wantHad := ref[key]
			if had != wantHad || old != wantOld {
				t.Fatalf("step %d: put(%d) = %d,%v want %d,%v", step, key, old, had, wantOld, wantHad)
			}
			ref[key] = val
		case 2:
			v, had := tb.remove(key)
			wantV, wantHad := ref[key]
			if had != wantHad || v != wantV {
				t.Fatalf("step %d: remove(%d) = %d,%v want %d,%v", step, key, v, had, wantV, wantHad)
			}
			delete(ref, key)
		}
		if step%1009 == 0 {
			if tb.len() != len(ref) {
				t.Fatalf("step %d: len %d, want %d", step, tb.len(), len(ref))
			}
			n := 0
			tb.each(func(k, v uint64) {
				n++
				if ref[k] != v {
					t.Fatalf("step %d: each gave %d=%d, want %d", step, k, v, ref[k])
				}
			})
			if n != len(ref) {
				t.Fatalf("step %d: each visited %d keys, want %d", step, n, len(ref))
			}
			checkOverflow(t, tb)
		}
	}
	if len(tb.counts) > 4 {
		t.Fatalf("table did not shrink: %d segments for %d keys", len(tb.counts), tb.len())
	}
}

// TestU64TableChurnKeepsOneSegment keeps one segment at 420 of its 448
// keys under churn: removals leave no tombstones, so it must never split,
// stay exact, and keep every group's overflow count equal to the keys
// whose probes pass it.
func TestU64TableChurnKeepsOneSegment(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	tb := newU64Table()
	ref := map[uint64]uint64{}
	var keys []uint64
	for len(keys) < 420 {
		k := rng.Uint64() | 1
		tb.put(k, k+1)
		ref[k] = k + 1
		keys = append(keys, k)
	}
	for step := range 200000 {
		j := rng.IntN(len(keys))
		if v, ok := tb.remove(keys[j]); !ok || v != ref[keys[j]] {
			t.Fatalf("step %d: remove(%#x) = %d,%v want %d", step, keys[j], v, ok, ref[keys[j]])
		}
		delete(ref, keys[j])
		k := rng.Uint64() | 1
		if _, had := tb.put(k, uint64(step)); had {
			t.Fatalf("step %d: put(%#x) found it there", step, k)
		}
		ref[k], keys[j] = uint64(step), k
		if len(tb.counts) != 1 {
			t.Fatalf("step %d: %d segments for %d keys", step, len(tb.counts), tb.len())
		}
		if step%997 == 0 {
			checkOverflow(t, tb)
		}
	}
	checkOverflow(t, tb)
	for k, v := range ref {
		if got, ok := tb.get(k); !ok || got != v {
			t.Fatalf("get(%#x) = %d,%v want %d", k, got, ok, v)
		}
	}
	n := 0
	tb.each(func(k, v uint64) {
		n++
		if ref[k] != v {
			t.Fatalf("each gave %#x=%d, want %d", k, v, ref[k])
		}
	})
	if n != len(ref) || tb.len() != len(ref) {
		t.Fatalf("each visited %d keys, len %d, want %d", n, tb.len(), len(ref))
	}
}

// checkOverflow recounts, in every segment, the keys that probed past
// each group and compares them with its overflow counts.
func checkOverflow(t *testing.T, tb *u64Table) {
	t.Helper()
	for j := 0; j < len(tb.dir); j += 1 << (tb.depth - tb.dir[j].depth) {
		e := &tb.dir[j]
		var want [wideGroups]int
		for i := range int(e.groups) * 8 {
			if *e.tags(i >> 3)>>(uint(i&7)*8)&0x80 == 0 {
				continue
			}
			for g := e.home(mixKey(e.at(i).key)); g != i>>3; g = e.next(g) {
				want[g]++
			}
		}
		for g := range int(e.groups) {
			if got := *e.ovf(g); int(got) != want[g] && (got != ovfSticky || want[g] < ovfSticky) {
				t.Fatalf("segment %d group %d: overflow %d, %d keys passed it", e.id, g, got, want[g])
			}
		}
	}
}

// TestU64TableBoundsItsDirectory checks that keys whose mixes share their
// leading bits, which would split one segment without end, stay exact
// and keep the directory small.
func TestU64TableBoundsItsDirectory(t *testing.T) {
	// inv is the inverse of mixKey's multiplier: mixKey(i*inv) == i.
	inv := uint64(0x9e3779b97f4a7c15)
	for range 6 {
		inv *= 2 - 0x9e3779b97f4a7c15*inv
	}
	if mixKey(inv) != 1 {
		t.Fatalf("mixKey(inv) = %#x, want 1", mixKey(inv))
	}
	tb := newU64Table()
	const n = 5000
	for i := uint64(1); i <= n; i++ {
		if _, had := tb.put(i*inv, i); had {
			t.Fatalf("put(%d) found it there", i)
		}
	}
	if tb.len() != n {
		t.Fatalf("len %d, want %d", tb.len(), n)
	}
	if len(tb.dir) > maxDirPerSeg*len(tb.counts) {
		t.Fatalf("directory of %d entries for %d segments", len(tb.dir), len(tb.counts))
	}
	for i := uint64(1); i <= n; i++ {
		if v, ok := tb.get(i * inv); !ok || v != i {
			t.Fatalf("get(%d) = %d,%v", i, v, ok)
		}
	}
	seen := 0
	tb.each(func(k, v uint64) {
		if k != v*inv {
			t.Fatalf("each gave %#x=%d", k, v)
		}
		seen++
	})
	if seen != n {
		t.Fatalf("each visited %d keys, want %d", seen, n)
	}
	for i := uint64(1); i <= n; i++ {
		if v, ok := tb.remove(i * inv); !ok || v != i {
			t.Fatalf("remove(%d) = %d,%v", i, v, ok)
		}
	}
	if tb.len() != 0 || len(tb.counts) != 1 {
		t.Fatalf("emptied table: len %d, %d segments", tb.len(), len(tb.counts))
	}
}

// TestU64TableReserve checks a table sized for a cache's capacity: it
// takes that many keys with few splits, stays exact while a grown table is
// resized under its keys, and does not shrink below its reservation when
// emptied.
func TestU64TableReserve(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	tb := newU64Table()
	tb.reserve(3000)
	if len(tb.counts) != 8 || tb.floor != 8 || tb.dir[0].groups != wideGroups {
		t.Fatalf("reserve(3000): %d segments of %d groups, floor %d; want 8 of %d and 8", len(tb.counts), tb.dir[0].groups, tb.floor, wideGroups)
	}
	ref := map[uint64]uint64{}
	for len(ref) < 3000 {
		k := rng.Uint64()
		tb.put(k, k^1)
		ref[k] = k ^ 1
	}
	// 3,000 keys over 8 segments of 768 slots average 375 a segment; a
	// split happens only where one drew more than 672.
	if len(tb.counts) > 10 {
		t.Fatalf("3000 keys in a table reserved for them split it into %d segments", len(tb.counts))
	}
	checkOverflow(t, tb)
	agree := func(when string) {
		t.Helper()
		if tb.len() != len(ref) {
			t.Fatalf("%s: len %d, want %d", when, tb.len(), len(ref))
		}
		for k, v := range ref {
			if got, ok := tb.get(k); !ok || got != v {
				t.Fatalf("%s: get(%#x) = %d,%v want %d", when, k, got, ok, v)
			}
		}
	}
	agree("filled")
	// A larger reservation moves the keys into a table of that size.
	tb.reserve(20000)
	if len(tb.counts) != 64 || tb.floor != 64 || tb.dir[0].groups != segGroups {
		t.Fatalf("reserve(20000): %d segments of %d groups, floor %d; want 64 of %d and 64", len(tb.counts), tb.dir[0].groups, tb.floor, segGroups)
	}
	agree("resized")
	checkOverflow(t, tb)
	// A smaller one keeps the table and lowers the floor.
	tb.reserve(6000)
	if len(tb.counts) != 64 || tb.floor != 16 {
		t.Fatalf("reserve(6000) after 20000: %d segments, floor %d; want 64 and 16", len(tb.counts), tb.floor)
	}
	for k := range ref {
		if _, ok := tb.remove(k); !ok {
			t.Fatalf("remove(%#x) missed", k)
		}
		delete(ref, k)
	}
	if tb.len() != 0 || len(tb.counts) != 16 {
		t.Fatalf("emptied: len %d, %d segments; want 0 and the 16 reserved", tb.len(), len(tb.counts))
	}
	// Refilled, it is still exact.
	for len(ref) < 5000 {
		k := rng.Uint64()
		tb.put(k, k+7)
		ref[k] = k + 7
	}
	agree("refilled")
	checkOverflow(t, tb)
	if nt := newU64TableFor(0); len(nt.counts) != 1 || nt.floor != 0 {
		t.Fatalf("newU64TableFor(0): %d segments, floor %d", len(nt.counts), nt.floor)
	}
}

// TestReservePlanStaysUnderTwoThirds checks the layouts reserve picks: at
// most 65 % full for the capacity asked, and no more slots than the
// smaller of the two shapes that are.
func TestReservePlanStaysUnderTwoThirds(t *testing.T) {
	for n := 1; n < 1<<21; n = n*5/4 + 1 {
		d, groups := reservePlan(n)
		slots := (1 << d) * int(groups) * 8
		if n*100 > slots*65 {
			t.Fatalf("reservePlan(%d): %d segments of %d groups, %d %% full", n, 1<<d, groups, n*100/slots)
		}
		for _, g := range []int{segGroups, wideGroups} {
			for dd := 0; dd < int(d)+2; dd++ {
				if s := (1 << dd) * g * 8; s < slots && s*65 >= n*100 {
					t.Fatalf("reservePlan(%d) = %d slots; %d segments of %d groups (%d slots) would do", n, slots, 1<<dd, g, s)
				}
			}
		}
	}
}
