package kvevents

// The sequencing rules (Core's doc comment, docs/architecture.md §3.2):
// per-worker numbers from the deliveries, and the claims load reports make.
// Everything here runs on the loop.

import "time"

// sequence checks a delivery's number against the worker's and reports
// whether the batch is to be skipped.
func (c *Core) sequence(worker string, d Delivery) (skip bool) {
	m := c.cfg.Metrics
	if d.NoSeq {
		m.Sequence(worker, SeqMissing)
		return false
	}
	seq := d.Seq
	if floor, ok := c.floor[worker]; ok {
		if seq != 0 && seq <= floor {
			return true // the loaded snapshot holds it already
		}
		delete(c.floor, worker)
	}
	last, seen := c.seqs[worker]
	c.seqs[worker] = seq
	ix := c.cfg.Index
	switch {
	case !seen:
		if seq != 0 {
			m.Sequence(worker, SeqJoin)
		}
	case seq == last+1:
	case seq == last:
		return true
	case seq > last:
		c.stats.gaps.Add(1)
		m.Sequence(worker, SeqGap)
		c.cfg.Logger.Warn("KV event sequence gap", "worker", worker, "last", last, "got", seq)
		ix.MarkStale(worker)
	case seq == 0:
		c.stats.fresh.Add(1)
		m.Sequence(worker, SeqFresh)
		c.cfg.Logger.Info("KV event stream started over", "worker", worker, "last", last)
		ix.Reset(worker)
	default:
		c.stats.restarts.Add(1)
		m.Sequence(worker, SeqRestart)
		c.cfg.Logger.Warn("KV event sequence went back", "worker", worker, "last", last, "got", seq)
		ix.MarkStale(worker)
	}
	return false
}

// claim is a worker's word (in a load report) that it has published up to
// batch seq.
type claim struct {
	worker string
	seq    uint64
	at     time.Time
	// restart: the worker's count of published batches went back to
	// seq+1 (seq is then the count itself, not a batch number): a new
	// process under the same id.
	restart bool
}

// Published tells the core that worker's publisher has numbered batches up
// to seq (a load report's kv_event_batches − 1). A batch that has not
// arrived once a later claim comes at least ClaimGrace after the first is
// lost: the worker is marked stale and the gap counted then, rather than at
// the worker's next batch, which a quiet worker may not send for a long
// time. Safe for concurrent use; claims are dropped when the loop is far
// behind.
func (c *Core) Published(worker string, seq uint64) {
	select {
	case c.claims <- claim{worker: worker, seq: seq, at: time.Now()}:
	default:
	}
}

// Restarted tells the core that worker's publisher now counts only
// published batches (a load report's kv_event_batches) where it counted
// more before: a new process under the same id, whose cache is empty. Its
// view is dropped at once, before its first batch arrives, unless that
// batch (number 0) has already started the worker over. Safe for
// concurrent use.
func (c *Core) Restarted(worker string, published uint64) {
	// A restart claim waits for room rather than being dropped: a stale
	// view would be credited until the worker's next batch.
	select {
	case c.claims <- claim{worker: worker, seq: published, at: time.Now(), restart: true}:
	case <-c.done:
	}
}

// restarted applies a restart claim; loop only.
func (c *Core) restarted(cl claim) {
	delete(c.pending, cl.worker)
	last, seen := c.seqs[cl.worker]
	if seen && last < cl.seq {
		// The new process's own batches 0…last have arrived, and the
		// first of them started the worker over already.
		return
	}
	if !c.cfg.Index.HasWorker(cl.worker) {
		return
	}
	// The next batch (the new process's first, numbered 0, or a later
	// one if the first are lost) joins the stream afresh.
	delete(c.seqs, cl.worker)
	delete(c.floor, cl.worker)
	c.stats.fresh.Add(1)
	c.cfg.Metrics.Sequence(cl.worker, SeqFresh)
	c.cfg.Logger.Info("worker restarted: its load report counts fewer KV event batches than before; its cached blocks are dropped", "worker", cl.worker, "published", cl.seq, "last", last)
	c.cfg.Index.Reset(cl.worker)
}

// claim checks a worker's claim against the batches applied; loop only.
func (c *Core) claim(cl claim) {
	if cl.restart {
		c.restarted(cl)
		return
	}
	last, seen := c.seqs[cl.worker]
	if !seen || cl.seq <= last || !c.cfg.Index.HasWorker(cl.worker) {
		// Nothing known to compare with (a worker we have not heard from
		// joins at its next batch), nothing missing, or not ours.
		delete(c.pending, cl.worker)
		return
	}
	first, waiting := c.pending[cl.worker]
	if !waiting || first.seq <= last {
		c.pending[cl.worker] = cl
		return
	}
	if cl.at.Sub(first.at) < c.cfg.ClaimGrace {
		return
	}
	// Batches last+1 … first.seq are lost. Take first.seq as applied so
	// the next batch is in sequence; the worker stays stale until it
	// resyncs (AllBlocksCleared or a fresh stream).
	delete(c.pending, cl.worker)
	c.seqs[cl.worker] = first.seq
	c.stats.gaps.Add(1)
	c.cfg.Metrics.Sequence(cl.worker, SeqGap)
	c.cfg.Logger.Warn("KV event batches lost: the worker's load report counts batches that never arrived", "worker", cl.worker, "last", last, "published", first.seq)
	c.cfg.Index.MarkStale(cl.worker)
}
