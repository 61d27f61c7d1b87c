package kvindex

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

// Index snapshots let a restarting router copy a peer replica's index
// instead of starting empty (a warm start). The format is versioned binary, little-endian:
//
//	magic "KVIXSNAP" | version u16 | flags u16 (0)
//	workers uvarint
//	per worker:
//	  id, model: uvarint length + bytes
//	  block_size uvarint | stale u8 (0/1) | has_seq u8 (0/1) | seq uvarint
//	  device entries uvarint, then (engine key u64, router hash u64) each
//	  off-device entries uvarint, then (engine key u64, router hash u64, media u8) each
//	crc32 (Castagnoli) u32 of everything before it
//
// seq is the worker's last applied KV event batch sequence number (the
// Kvroute-Seq header) at the moment of the snapshot, so the receiver can
// skip the batches the snapshot already holds and detect a gap after it.
// Everything else of a worker's state (the block table bits, duplicate and
// off-device counts) is rebuilt from the entries.

// SnapshotMagic opens every index snapshot.
const SnapshotMagic = "KVIXSNAP"

// SnapshotVersion is the format version WriteSnapshot writes and the only
// one ReadSnapshot accepts.
const SnapshotVersion = 1

// Decoder limits: a snapshot is input from the network.
const (
	maxSnapshotWorkers = 1 << 16
	maxSnapshotString  = 1 << 10
	maxSnapshotEntries = 1 << 30
)

var snapCRC = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshot wraps every reason a snapshot is refused.
var ErrSnapshot = errors.New("kvindex snapshot")

// WriteSnapshot writes the index's device and off-device holdings of every
// worker to w; seqs, if not nil, gives workers' last applied batch
// sequence numbers. The index is read-locked while it writes (Match runs
// on; Apply waits), so callers write to a buffer when w is slow.
func (ix *Index) WriteSnapshot(w io.Writer, seqs map[string]uint64) error {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	crc := crc32.New(snapCRC)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 64<<10)
	var buf [binary.MaxVarintLen64 + 17]byte
	put := func(b []byte) { _, _ = bw.Write(b) }
	uv := func(v uint64) { put(binary.AppendUvarint(buf[:0], v)) }
	str := func(s string) { uv(uint64(len(s))); _, _ = bw.WriteString(s) }

	put([]byte(SnapshotMagic))
	put(binary.LittleEndian.AppendUint16(buf[:0], SnapshotVersion))
	put(binary.LittleEndian.AppendUint16(buf[:0], 0))
	workers := make([]*workerState, 0, len(ix.workers))
	for _, ws := range ix.slots {
		if ws != nil {
			workers = append(workers, ws)
		}
	}
	uv(uint64(len(workers)))
	for _, ws := range workers {
		str(ws.id)
		str(ws.model)
		uv(uint64(ws.blockSize))
		seq, hasSeq := seqs[ws.id]
		put([]byte{flagByte(ws.stale), flagByte(hasSeq)})
		uv(seq)
		uv(uint64(ws.device.len()))
		ws.device.each(func(k, at uint64) {
			b := binary.LittleEndian.AppendUint64(buf[:0], k)
			put(binary.LittleEndian.AppendUint64(b, ix.tab.cell(at).hash))
		})
		uv(uint64(len(ws.offDevice)))
		for k, oe := range ws.offDevice {
			b := binary.LittleEndian.AppendUint64(buf[:0], k)
			b = binary.LittleEndian.AppendUint64(b, oe.router)
			put(append(b, oe.media))
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write index snapshot: %w", err)
	}
	if _, err := w.Write(binary.LittleEndian.AppendUint32(nil, crc.Sum32())); err != nil {
		return fmt.Errorf("write index snapshot: %w", err)
	}
	return nil
}

func flagByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// Snapshot is a decoded index snapshot, checked and ready to load.
type Snapshot struct {
	Workers []SnapshotWorker
}

// SnapshotWorker is one worker's part of a Snapshot.
type SnapshotWorker struct {
	ID, Model string
	BlockSize int
	Stale     bool
	// Seq is the last applied batch sequence number, when HasSeq.
	Seq    uint64
	HasSeq bool
	// Device holds (engine key, router hash) pairs; OffDevice (engine
	// key, router hash, media bits).
	Device    [][2]uint64
	OffDevice []SnapshotOffEntry
}

// SnapshotOffEntry is one off-device holding.
type SnapshotOffEntry struct {
	Key, Router uint64
	Media       uint8
}

// Entries counts the snapshot's device and off-device entries.
func (s *Snapshot) Entries() int {
	n := 0
	for _, w := range s.Workers {
		n += len(w.Device) + len(w.OffDevice)
	}
	return n
}

// Seqs returns the workers' sequence numbers the snapshot carries.
func (s *Snapshot) Seqs() map[string]uint64 {
	out := map[string]uint64{}
	for _, w := range s.Workers {
		if w.HasSeq {
			out[w.ID] = w.Seq
		}
	}
	return out
}

// snapReader decodes with a running checksum and bounds.
type snapReader struct {
	r     *bufio.Reader
	crc   hash.Hash32
	buf   [17]byte
	chunk [16 << 10]byte
	err   error
}

// bulk reads n ≤ len(chunk) bytes into the chunk buffer, checksummed once.
func (d *snapReader) bulk(n int) []byte {
	if d.err != nil {
		return nil
	}
	if _, err := io.ReadFull(d.r, d.chunk[:n]); err != nil {
		d.fail("truncated: %v", err)
		return nil
	}
	_, _ = d.crc.Write(d.chunk[:n])
	return d.chunk[:n]
}

func (d *snapReader) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrSnapshot}, args...)...)
	}
}

func (d *snapReader) full(n int) []byte {
	if d.err != nil {
		return nil
	}
	if _, err := io.ReadFull(d.r, d.buf[:n]); err != nil {
		d.fail("truncated: %v", err)
		return nil
	}
	_, _ = d.crc.Write(d.buf[:n])
	return d.buf[:n]
}

func (d *snapReader) u8() uint8 {
	if b := d.full(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *snapReader) u64() uint64 {
	if b := d.full(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *snapReader) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	var x uint64
	for s := uint(0); ; s += 7 {
		b := d.u8()
		if d.err != nil {
			return 0
		}
		if s == 63 && b > 1 {
			d.fail("varint overflows 64 bits")
			return 0
		}
		x |= uint64(b&0x7f) << s
		if b < 0x80 {
			return x
		}
	}
}

func (d *snapReader) count(what string, limit uint64) int {
	n := d.uvarint()
	if n > limit {
		d.fail("%s count %d exceeds the limit %d", what, n, limit)
		return 0
	}
	return int(n)
}

func (d *snapReader) str(what string) string {
	n := d.count(what+" length", maxSnapshotString)
	if d.err != nil {
		return ""
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		d.fail("truncated %s: %v", what, err)
		return ""
	}
	_, _ = d.crc.Write(b)
	return string(b)
}

func (d *snapReader) flag(what string) bool {
	switch b := d.u8(); b {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("%s flag %d is not 0 or 1", what, b)
		return false
	}
}

// ReadSnapshot decodes and checks a snapshot from r: magic, version,
// bounds, media bits and the trailing checksum. It reads r to the end of
// the snapshot and returns an error wrapping ErrSnapshot for anything
// malformed; it never panics on bad input.
func ReadSnapshot(r io.Reader) (*Snapshot, error) {
	d := &snapReader{r: bufio.NewReaderSize(r, 64<<10), crc: crc32.New(snapCRC)}
	magic := make([]byte, len(SnapshotMagic))
	if _, err := io.ReadFull(d.r, magic); err != nil || string(magic) != SnapshotMagic {
		return nil, fmt.Errorf("%w: not an index snapshot (bad magic)", ErrSnapshot)
	}
	_, _ = d.crc.Write(magic)
	var v [4]byte
	copy(v[:], d.full(4))
	if d.err != nil {
		return nil, d.err
	}
	if ver := binary.LittleEndian.Uint16(v[:2]); ver != SnapshotVersion {
		return nil, fmt.Errorf("%w: version %d, this router reads version %d", ErrSnapshot, ver, SnapshotVersion)
	}
	if flags := binary.LittleEndian.Uint16(v[2:]); flags != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrSnapshot, flags)
	}
	s := &Snapshot{}
	nw := d.count("worker", maxSnapshotWorkers)
	seen := map[string]bool{}
	for i := 0; i < nw && d.err == nil; i++ {
		w := SnapshotWorker{ID: d.str("worker id"), Model: d.str("model")}
		bs := d.uvarint()
		w.Stale, w.HasSeq = d.flag("stale"), d.flag("has_seq")
		w.Seq = d.uvarint()
		if d.err != nil {
			break
		}
		if w.ID == "" || seen[w.ID] {
			d.fail("worker %d: empty or repeated id %q", i, w.ID)
			break
		}
		if bs == 0 || bs > 1<<20 {
			d.fail("worker %q: block size %d", w.ID, bs)
			break
		}
		seen[w.ID], w.BlockSize = true, int(bs)
		n := d.count("device entry", maxSnapshotEntries)
		// Grow as entries arrive rather than trusting the count for memory.
		w.Device = make([][2]uint64, 0, min(n, 1024))
		for left := n; left > 0 && d.err == nil; {
			k := min(left, len(d.chunk)/16)
			b := d.bulk(k * 16)
			for j := 0; j < len(b); j += 16 {
				w.Device = append(w.Device, [2]uint64{binary.LittleEndian.Uint64(b[j:]), binary.LittleEndian.Uint64(b[j+8:])})
			}
			left -= k
		}
		n = d.count("off-device entry", maxSnapshotEntries)
		w.OffDevice = make([]SnapshotOffEntry, 0, min(n, 1024))
		for j := 0; j < n && d.err == nil; j++ {
			e := SnapshotOffEntry{Key: d.u64(), Router: d.u64(), Media: d.u8()}
			if d.err == nil && (e.Media == 0 || e.Media&^(mediaCPU|mediaOther) != 0) {
				d.fail("worker %q: off-device media bits %#x", w.ID, e.Media)
			}
			w.OffDevice = append(w.OffDevice, e)
		}
		s.Workers = append(s.Workers, w)
	}
	if d.err != nil {
		return nil, d.err
	}
	want := d.crc.Sum32()
	var sum [4]byte
	if _, err := io.ReadFull(d.r, sum[:]); err != nil {
		return nil, fmt.Errorf("%w: truncated before its checksum", ErrSnapshot)
	}
	if got := binary.LittleEndian.Uint32(sum[:]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, content sums to %08x", ErrSnapshot, got, want)
	}
	return s, nil
}

// LoadStats says what LoadSnapshot did.
type LoadStats struct {
	// Workers loaded, and skipped because the index does not know them
	// or knows them with another model or block size.
	Workers, Skipped int
	// Entries are the device blocks (distinct router hashes) loaded.
	Entries int
}

// LoadSnapshot replaces the holdings of every worker in s that the index
// knows with the same model and block size; other workers in s are
// skipped (discovery decides who exists). Workers not in s keep theirs.
func (ix *Index) LoadSnapshot(s *Snapshot) LoadStats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var st LoadStats
	load := make([]*workerState, len(s.Workers))
	for i := range s.Workers {
		sw := &s.Workers[i]
		if w := ix.workers[sw.ID]; w != nil && w.model == sw.Model && w.blockSize == sw.BlockSize {
			load[i] = w
		}
	}
	// A snapshot's blocks come without their parents: each is looked up
	// among every cell (it may be in the middle of a chain), and one that
	// has none starts a chain of its own.
	t := ix.tab
	var cells map[uint64]uint64
	cellOf := func(r uint64) uint64 {
		if cells == nil {
			cells = t.cellsByHash()
		}
		// A remembered place whose cell was freed since (a purge, a
		// repeated key) may hold another block now, or nothing.
		if at, ok := cells[r]; ok {
			if ch := t.chains[at>>32].cells; int(uint32(at)) < len(ch) && ch[uint32(at)].hash == r {
				return at
			}
		}
		at := t.placeUnlinked(r)
		cells[r] = at
		return at
	}
	for i := range s.Workers {
		sw := &s.Workers[i]
		w := load[i]
		if w == nil {
			st.Skipped++
			continue
		}
		ix.purge(w)
		w.stale = sw.Stale
		t.begin(true)
		for _, e := range sw.Device {
			at := cellOf(e[1])
			old, had := w.device.get(e[0])
			if had && old == at {
				continue
			}
			held := t.hold(at, w.idx)
			w.device.put(e[0], at)
			if had {
				ix.dropDevice(w, old) // a repeated key: the last one wins
			}
			if held {
				w.dups[e[1]]++
			} else {
				w.blocks++
			}
		}
		t.end()
		for _, e := range sw.OffDevice {
			at := cellOf(e.Router)
			t.pin(at)
			if oe, had := w.offDevice[e.Key]; had {
				w.countOff(oe.router, oe.media, -1)
				t.unpin(oe.at)
			}
			w.offDevice[e.Key] = offEntry{router: e.Router, at: at, media: e.Media}
			w.countOff(e.Router, e.Media, 1)
		}
		ix.sync(w)
		st.Workers++
		st.Entries += w.blocks
	}
	ix.gen++
	return st
}
