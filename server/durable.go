package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/kvindex"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// durable is the --durable-events state: the JetStream stream that
// captures the namespace's KV events and the object store its index
// snapshots go to (docs/architecture.md §3.4.3).
type durable struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	store  *bus.SnapshotStore
	// lastSeq is the stream sequence of the last snapshot this replica
	// wrote (or loaded): an unchanged index is not written again.
	mu      sync.Mutex // one snapshot at a time; guards lastSeq, wrote
	lastSeq uint64
	wrote   bool
	// loadTook is how long fetching, decoding and loading the snapshot
	// took at start (the rest of the recovery is the replay).
	loadTook time.Duration
}

// defaultJetStreamDir is the embedded NATS server's store when none is
// configured: one per client port, so two routers on one host do not share
// a store (the lock refuses that anyway) while a restart on the same port
// finds its stream again. A random port (natsserver.RANDOM_PORT) gets a
// directory of its own, which a restart cannot find.
func defaultJetStreamDir(port int) string {
	if port == natsserver.RANDOM_PORT {
		if dir, err := os.MkdirTemp("", "kvroute-jetstream-random-"); err == nil {
			return dir
		}
	}
	return filepath.Join(os.TempDir(), "kvroute-jetstream-"+strconv.Itoa(port))
}

// setupDurable ensures the event stream and the snapshot bucket.
func (r *Server) setupDurable() error {
	rc := r.cfg.Recovery
	js, err := jetstream.New(r.nc)
	if err != nil {
		return fmt.Errorf("durable events: %w", err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	st, err := bus.EnsureEventStream(ctx, js, r.cfg.Namespace, bus.EventStreamLimits{MaxAge: rc.EventsMaxAge, MaxBytes: rc.EventsMaxBytes, Replicas: rc.JetStreamReplicas})
	switch {
	case errors.Is(err, bus.ErrEventSubjectsTaken):
		return fmt.Errorf("durable events: %w", err)
	case err != nil:
		return fmt.Errorf("durable events (is JetStream enabled on the NATS server?): %w", err)
	}
	store, err := bus.OpenSnapshotStore(ctx, js, r.cfg.Namespace, rc.JetStreamReplicas)
	if err != nil {
		return fmt.Errorf("durable events: %w", err)
	}
	r.durable = &durable{js: js, stream: st, store: store}
	return nil
}

// durableRecover runs after discovery and before the event core starts:
// it loads the newest snapshot from the object store (if any), seeds the
// core with the sequence numbers it covers, starts the core at
// the next stream message and waits until the core has caught up
// with the stream's last message as of now. Only then does Start go on
// and the router turn ready. Messages that aged out of the stream since
// the snapshot leave every known worker stale, so each gets a resync.
func (r *Server) durableRecover() error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Recovery.WarmTimeout)
	defer cancel()
	d, hm := r.durable, r.metrics.health
	var covered uint64
	entries := 0
	meta, size, body, err := d.store.Newest(ctx)
	switch {
	case errors.Is(err, bus.ErrNoSnapshot):
		r.log.Info("durable events: no index snapshot stored; replaying the whole stream")
	case err != nil:
		r.log.Warn("durable events: the index snapshot could not be read; replaying the whole stream", "err", err)
		hm.snapshotErrors.WithLabelValues("load").Inc()
	default:
		s, rerr := kvindex.ReadSnapshot(body)
		_ = body.Close()
		if rerr != nil {
			r.log.Warn("durable events: the stored index snapshot is not valid; replaying the whole stream", "router", meta.Router, "err", rerr)
			hm.snapshotErrors.WithLabelValues("load").Inc()
			break
		}
		ls := r.index.LoadSnapshot(s)
		r.events.Seed(s.Seqs())
		covered, entries = meta.StreamSeq, ls.Entries
		d.lastSeq, d.loadTook = covered, time.Since(start)
		r.log.Info("durable events: index snapshot loaded", "stream_seq", covered, "bytes", size, "workers", ls.Workers,
			"skipped_workers", ls.Skipped, "entries", ls.Entries, "taken_by", meta.Router, "age", time.Since(meta.TakenAt).Round(time.Second))
	}
	info, err := d.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("durable events: stream info: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if covered > last {
		// The snapshot covers messages this stream never held: the stream
		// was deleted and created again (a wiped JetStream store, an
		// operator's `nats stream rm`) and its sequence started over.
		// Whatever the workers published in between is in the new stream
		// from its first message or is gone, so replay it all and trust no
		// worker until it resyncs.
		stale := r.markAllStale()
		r.log.Warn("durable events: the index snapshot is ahead of the stream, which must have been created again; replaying the whole stream, every worker is stale until it resyncs",
			"snapshot_seq", covered, "stream_first_seq", first, "stream_last_seq", last, "stale_workers", stale)
		covered = 0
		if first > 0 {
			covered = first - 1
		}
	}
	if first > covered+1 {
		// Messages covered+1 … first-1 were discarded (age or size
		// limit) before this replica saw them: nobody knows which workers
		// they touched.
		lost := first - covered - 1
		hm.agedOut.Add(float64(lost))
		stale := r.markAllStale()
		r.log.Warn("durable events: KV events aged out of the stream before this replica recovered; every worker is stale until it resyncs",
			"snapshot_seq", covered, "stream_first_seq", first, "lost_messages", lost, "stale_workers", stale)
	}
	// Start at the first message still there: the stale marks stand for
	// the ones that are gone.
	replayFrom := max(covered+1, first)
	r.events.SeedCursor(replayFrom - 1)
	if err := r.events.Start(r.ctx); err != nil {
		return fmt.Errorf("kv events: %w", err)
	}
	if err := bus.ConsumeEventStream(r.ctx, d.js, bus.EventStreamName(r.cfg.Namespace), r.cfg.Namespace, r.events, r.log); err != nil {
		return fmt.Errorf("kv events: %w", err)
	}
	for last >= replayFrom && r.events.Cursor() < last {
		select {
		case <-ctx.Done():
			r.log.Warn("durable events: the stream replay did not catch up in time; turning ready behind the stream",
				"at", r.events.Cursor(), "target", last, "timeout", r.cfg.Recovery.WarmTimeout)
			return nil
		case <-time.After(5 * time.Millisecond):
		}
	}
	replayed := uint64(0)
	if last >= replayFrom {
		replayed = last - replayFrom + 1
	}
	took := time.Since(start)
	hm.recoverySeconds.Set(took.Seconds())
	hm.recoveryEntries.Set(float64(r.index.Stats().Entries))
	hm.recoveryReplayed.Set(float64(replayed))
	r.log.Info("durable events: index recovered", "snapshot_entries", entries, "snapshot_seq", covered, "replayed", replayed,
		"snapshot_took", d.loadTook.Round(time.Millisecond), "stream_last_seq", last, "entries", r.index.Stats().Entries, "took", took.Round(time.Millisecond))
	return nil
}

// markAllStale marks every worker the index holds stale (no overlap credit
// until it resyncs) and reports how many there were.
func (r *Server) markAllStale() int {
	stale := 0
	for _, w := range r.index.Stats().PerWorker {
		r.index.MarkStale(w.ID)
		stale++
	}
	return stale
}

// runSnapshots writes the index to the object store every
// SnapshotInterval until the router stops.
func (r *Server) runSnapshots() {
	every := r.cfg.Recovery.SnapshotInterval
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.writeSnapshot(r.ctx); err != nil && r.ctx.Err() == nil {
			r.log.Warn("durable events: index snapshot failed", "err", err)
		}
	}
}

// writeSnapshot takes a consistent snapshot (on the consumer's loop: the
// index after exactly the stream's messages up to the sequence recorded)
// and stores it, unless nothing arrived since the last one. It reports the
// stream sequence covered.
func (r *Server) writeSnapshot(ctx context.Context) (uint64, error) {
	d, hm := r.durable, r.metrics.health
	d.mu.Lock()
	defer d.mu.Unlock()
	var buf bytes.Buffer
	var seq uint64
	var werr error
	start := time.Now()
	if err := r.events.Do(ctx, func(seqs map[string]uint64) {
		seq = r.events.Cursor()
		if d.wrote && seq == d.lastSeq {
			return
		}
		werr = r.index.WriteSnapshot(&buf, seqs)
	}); err != nil {
		werr = err
	}
	if werr == nil && buf.Len() == 0 {
		return seq, nil // unchanged
	}
	if werr == nil {
		werr = d.store.Put(ctx, bus.SnapshotMeta{StreamSeq: seq, Version: kvindex.SnapshotVersion, Router: r.cfg.RouterID, TakenAt: start}, buf.Bytes())
	}
	if werr != nil {
		hm.snapshotErrors.WithLabelValues("write").Inc()
		hm.snapshotLastError.Set(1)
		return 0, werr
	}
	d.lastSeq, d.wrote = seq, true
	hm.snapshotLastError.Set(0)
	hm.snapshotBytes.Set(float64(buf.Len()))
	hm.snapshotTime.Set(float64(start.Unix()))
	r.log.Info("durable events: index snapshot stored", "stream_seq", seq, "bytes", buf.Len(), "took", time.Since(start).Round(time.Millisecond))
	return seq, nil
}

// SnapshotNow writes an index snapshot to the object store now (with
// --durable-events) and returns the stream sequence it covers.
func (r *Server) SnapshotNow(ctx context.Context) (uint64, error) {
	if r.durable == nil {
		return 0, errors.New("durable events are off")
	}
	return r.writeSnapshot(ctx)
}

// finalSnapshot is the clean-shutdown snapshot.
func (r *Server) finalSnapshot() {
	if r.durable == nil || r.events == nil || r.nc == nil || !r.nc.IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.writeSnapshot(ctx); err != nil {
		r.log.Warn("durable events: shutdown snapshot failed", "err", err)
	}
}
