package main

import (
	"math/rand/v2"
)

// GenConfig shapes a generated workload.
type GenConfig struct {
	Workers   int
	BlockSize int
	// Capacity is each worker's KV cache in blocks: past it, the worker
	// evicts its oldest request's blocks that no newer request holds.
	Capacity int
	// Stored is how many blocks the stored events carry in all.
	Stored int
	// PerCase is how many queries of each case to write.
	PerCase int
	Seed    uint64
}

const (
	systemPrompts = 16    // shared system prompts
	systemBlocks  = 256   // blocks of each
	contentPool   = 65536 // block contents of everything not a system prompt
	queryBlocks   = 512
)

// request is a prompt a worker holds: engine hashes and contents of its
// blocks, from the root.
type request struct {
	hashes   []uint64
	contents []uint32
}

// genWorker is one simulated engine's prefix cache.
type genWorker struct {
	refs  map[uint64]int32 // engine hash → live requests that include it
	queue []request        // live requests, oldest first
}

// Generate builds a workload: requests go to uniformly random workers;
// each worker caches them as vLLM's prefix cache does (a request stores
// the blocks it does not hold yet, chained to the ones it does) and, past
// its capacity, evicts its oldest requests tail first, so a worker never
// holds a block without its prefix. Requests mix a shared system prompt
// and a user part (half), a prompt of their own (three in ten) and the
// worker's latest request extended by a turn (two in ten).
func Generate(cfg GenConfig) *Workload {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b76726f757465))
	w := &Workload{BlockSize: cfg.BlockSize, Workers: cfg.Workers, Capacity: cfg.Capacity}
	nContents := systemPrompts*systemBlocks + contentPool
	w.Contents = make([][]uint32, nContents)
	for i := range w.Contents {
		c := make([]uint32, cfg.BlockSize)
		for j := range c {
			c[j] = uint32(rng.IntN(150_000))
		}
		w.Contents[i] = c
	}
	randomContent := func() uint32 { return uint32(systemPrompts*systemBlocks + rng.IntN(contentPool)) }
	system := func(k int) []uint32 {
		out := make([]uint32, systemBlocks)
		for i := range out {
			out[i] = uint32(k*systemBlocks + i)
		}
		return out
	}
	workers := make([]genWorker, cfg.Workers)
	for i := range workers {
		workers[i].refs = map[uint64]int32{}
	}
	entries := 0
	for stored := 0; stored < cfg.Stored; {
		wi := rng.IntN(cfg.Workers)
		gw := &workers[wi]
		var contents []uint32
		switch p := rng.IntN(10); {
		case p < 5:
			contents = system(rng.IntN(systemPrompts))
			user := 32 + rng.IntN(225)
			if rng.IntN(4) == 0 {
				user = queryBlocks - systemBlocks
			}
			for range user {
				contents = append(contents, randomContent())
			}
		case p < 8 || len(gw.queue) == 0:
			for range 64 + rng.IntN(449) {
				contents = append(contents, randomContent())
			}
		default:
			last := gw.queue[len(gw.queue)-1].contents
			if len(last) > 768 {
				last = last[:256]
			}
			contents = append(contents, last...)
			for range 16 + rng.IntN(49) {
				contents = append(contents, randomContent())
			}
		}
		req := request{hashes: chainHashes(contents), contents: contents}
		first := 0
		for first < len(req.hashes) && gw.refs[req.hashes[first]] > 0 {
			first++
		}
		if first < len(req.hashes) {
			ev := Event{Kind: kindStored, Worker: wi, Hashes: req.hashes[first:], Contents: contents[first:]}
			if first > 0 {
				ev.Parent = req.hashes[first-1]
			}
			w.Events = append(w.Events, ev)
			stored += len(ev.Hashes)
			entries += len(ev.Hashes)
		}
		for _, h := range req.hashes {
			gw.refs[h]++
		}
		gw.queue = append(gw.queue, req)
		for len(gw.refs) > cfg.Capacity {
			old := gw.queue[0]
			gw.queue = gw.queue[1:]
			var gone []uint64
			for j := len(old.hashes) - 1; j >= 0; j-- {
				h := old.hashes[j]
				if gw.refs[h]--; gw.refs[h] == 0 {
					delete(gw.refs, h)
					gone = append(gone, h)
				}
			}
			if len(gone) > 0 {
				w.Events = append(w.Events, Event{Kind: kindRemoved, Worker: wi, Hashes: gone})
				entries -= len(gone)
			}
		}
	}
	w.FinalEntries = entries

	// Prompts some worker holds in full, from the final state.
	var held [][]uint32
	for _, gw := range workers {
		for _, r := range gw.queue {
			if len(r.contents) >= queryBlocks {
				held = append(held, r.contents[:queryBlocks])
			}
		}
	}
	rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
	for i := range cfg.PerCase {
		w.Queries = append(w.Queries, Query{Case: caseFull, Contents: held[i%len(held)]})
	}
	for i := range cfg.PerCase {
		src := held[(i+cfg.PerCase)%len(held)]
		keep := 1 + rng.IntN(8)
		q := append([]uint32(nil), src[:keep]...)
		for len(q) < queryBlocks {
			q = append(q, randomContent())
		}
		w.Queries = append(w.Queries, Query{Case: caseEarly, Contents: q})
	}
	for range cfg.PerCase {
		q := system(rng.IntN(systemPrompts))
		for len(q) < queryBlocks {
			q = append(q, randomContent())
		}
		w.Queries = append(w.Queries, Query{Case: caseSystem, Contents: q})
	}
	return w
}

// chainHashes gives the engine hashes of a chain of block contents: each
// hash depends on its parent's and its own content, as an engine's prefix
// hashes do, so equal prefixes get equal hashes on every worker.
func chainHashes(contents []uint32) []uint64 {
	out := make([]uint64, len(contents))
	var h uint64 = 0x9e3779b97f4a7c15
	for i, c := range contents {
		h = mix64(h ^ (uint64(c)+1)*0xbf58476d1ce4e5b9)
		if h == 0 {
			h = 1
		}
		out[i] = h
	}
	return out
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
