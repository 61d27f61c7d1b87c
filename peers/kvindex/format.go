package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// The workload file, little-endian throughout, read by this program and by
// the Rust harness in peers/dynamo-index (src/workload.rs) alike:
//
//	header   magic "KVIPEER2" (8 bytes)
//	         u32 block_size, u32 workers, u32 capacity, u32 contents, u32 events,
//	         u32 queries, u64 final_entries
//	contents contents × block_size × u32 token ids: block contents, by index
//	events   per event: u8 kind (1 stored, 2 removed), u32 worker, u32 n, then
//	           stored:  u64 parent engine hash (0: the chain starts at the
//	                    root), n × (u64 engine hash, u32 content)
//	           removed: n × u64 engine hash
//	queries  per query: u8 case (0 full, 1 early, 2 system), u32 n,
//	           n × u32 content
//
// A block's tokens are its content's; an event's or a prompt's tokens are
// its blocks' contents in order. Engine hashes are never 0.
// capacity is each worker's KV cache in blocks, as an engine states it
// (vLLM's num_gpu_blocks). final_entries is the number of (block, worker)
// pairs held after the last event.
const magic = "KVIPEER2"

const (
	kindStored  = 1
	kindRemoved = 2
)

// Query cases.
const (
	caseFull   = 0 // a prompt some worker holds entirely
	caseEarly  = 1 // a held prompt's first 1..8 blocks, then new blocks
	caseSystem = 2 // a shared 256-block system prompt, then new blocks
)

var caseNames = [...]string{"full", "early", "system"}

// Workload is a workload file in memory.
type Workload struct {
	BlockSize    int
	Workers      int
	Capacity     int        // KV blocks per worker
	Contents     [][]uint32 // token ids of each block content
	Events       []Event
	Queries      []Query
	FinalEntries int
}

// Event is one KV event of one worker.
type Event struct {
	Kind     uint8
	Worker   int
	Parent   uint64   // stored only; 0: root
	Hashes   []uint64 // engine hashes
	Contents []uint32 // stored only: content of each block
}

// Query is one prompt to look up.
type Query struct {
	Case     uint8
	Contents []uint32
}

// Tokens returns the token ids of blocks with the given contents.
func (w *Workload) Tokens(contents []uint32) []uint32 {
	out := make([]uint32, 0, len(contents)*w.BlockSize)
	for _, c := range contents {
		out = append(out, w.Contents[c]...)
	}
	return out
}

// Write writes w to path.
func (w *Workload) Write(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	le := binary.LittleEndian
	var buf []byte
	put32 := func(v uint32) { buf = le.AppendUint32(buf, v) }
	put64 := func(v uint64) { buf = le.AppendUint64(buf, v) }
	flush := func() {
		_, _ = bw.Write(buf) // a failed write sticks: the Flush below reports it
		buf = buf[:0]
	}
	buf = append(buf, magic...)
	put32(uint32(w.BlockSize))
	put32(uint32(w.Workers))
	put32(uint32(w.Capacity))
	put32(uint32(len(w.Contents)))
	put32(uint32(len(w.Events)))
	put32(uint32(len(w.Queries)))
	put64(uint64(w.FinalEntries))
	for _, c := range w.Contents {
		for _, t := range c {
			put32(t)
		}
		flush()
	}
	for _, e := range w.Events {
		buf = append(buf, e.Kind)
		put32(uint32(e.Worker))
		put32(uint32(len(e.Hashes)))
		if e.Kind == kindStored {
			put64(e.Parent)
			for i, h := range e.Hashes {
				put64(h)
				put32(e.Contents[i])
			}
		} else {
			for _, h := range e.Hashes {
				put64(h)
			}
		}
		flush()
	}
	for _, q := range w.Queries {
		buf = append(buf, q.Case)
		put32(uint32(len(q.Contents)))
		for _, c := range q.Contents {
			put32(c)
		}
		flush()
	}
	if err := bw.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// Read reads a workload file.
func Read(path string) (*Workload, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &byteReader{b: data}
	if string(r.next(len(magic))) != magic {
		return nil, fmt.Errorf("%s: not a workload file of this version (magic %q); delete it and run gen again", path, magic)
	}
	w := &Workload{BlockSize: int(r.u32()), Workers: int(r.u32()), Capacity: int(r.u32())}
	nContents, nEvents, nQueries := int(r.u32()), int(r.u32()), int(r.u32())
	w.FinalEntries = int(r.u64())
	if r.err != nil || w.BlockSize <= 0 || w.BlockSize > 1<<16 {
		return nil, fmt.Errorf("%s: bad header", path)
	}
	w.Contents = make([][]uint32, nContents)
	flat := make([]uint32, nContents*w.BlockSize)
	for i := range w.Contents {
		c := flat[i*w.BlockSize : (i+1)*w.BlockSize]
		for j := range c {
			c[j] = r.u32()
		}
		w.Contents[i] = c
	}
	w.Events = make([]Event, nEvents)
	for i := range w.Events {
		e := &w.Events[i]
		e.Kind, e.Worker = r.u8(), int(r.u32())
		n := int(r.u32())
		if r.err != nil || n > len(r.b) || e.Worker >= w.Workers {
			return nil, fmt.Errorf("%s: event %d: bad header", path, i)
		}
		e.Hashes = make([]uint64, n)
		switch e.Kind {
		case kindStored:
			e.Parent = r.u64()
			e.Contents = make([]uint32, n)
			for j := range e.Hashes {
				e.Hashes[j], e.Contents[j] = r.u64(), r.u32()
				if int(e.Contents[j]) >= nContents {
					return nil, fmt.Errorf("%s: event %d: content out of range", path, i)
				}
			}
		case kindRemoved:
			for j := range e.Hashes {
				e.Hashes[j] = r.u64()
			}
		default:
			return nil, fmt.Errorf("%s: event %d: kind %d", path, i, e.Kind)
		}
	}
	w.Queries = make([]Query, nQueries)
	for i := range w.Queries {
		q := &w.Queries[i]
		q.Case = r.u8()
		n := int(r.u32())
		if r.err != nil || n > len(r.b) || int(q.Case) >= len(caseNames) {
			return nil, fmt.Errorf("%s: query %d: bad header", path, i)
		}
		q.Contents = make([]uint32, n)
		for j := range q.Contents {
			q.Contents[j] = r.u32()
			if int(q.Contents[j]) >= nContents {
				return nil, fmt.Errorf("%s: query %d: content out of range", path, i)
			}
		}
	}
	if r.err != nil {
		return nil, fmt.Errorf("%s: %w", path, r.err)
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%s: %d trailing bytes", path, len(r.b))
	}
	return w, nil
}

type byteReader struct {
	b   []byte
	err error
}

func (r *byteReader) next(n int) []byte {
	if r.err != nil || len(r.b) < n {
		if r.err == nil {
			r.err = io.ErrUnexpectedEOF
		}
		r.b = nil
		return make([]byte, n)
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *byteReader) u8() uint8   { return r.next(1)[0] }
func (r *byteReader) u32() uint32 { return binary.LittleEndian.Uint32(r.next(4)) }
func (r *byteReader) u64() uint64 { return binary.LittleEndian.Uint64(r.next(8)) }
