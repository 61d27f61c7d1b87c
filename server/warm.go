package server

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/kvindex"
)

// SnapshotPath serves this replica's KV index as a versioned binary
// snapshot (kvindex.WriteSnapshot) for a restarting peer's warm start.
const SnapshotPath = "/debug/index/snapshot"

// handleSnapshot writes the index snapshot. It is taken on the event
// consumer's loop, so the sequence numbers it carries match the index, into
// a buffer, so a slow reader does not hold the index lock.
func (r *Server) handleSnapshot(w http.ResponseWriter, req *http.Request) {
	var buf bytes.Buffer
	var err error
	start := time.Now()
	if r.events != nil {
		derr := r.events.Do(req.Context(), func(seqs map[string]uint64) { err = r.index.WriteSnapshot(&buf, seqs) })
		if derr != nil {
			err = derr
		}
	} else {
		err = r.index.WriteSnapshot(&buf, nil)
	}
	if err != nil {
		writeError(w, &extproc.HTTPError{Status: http.StatusServiceUnavailable, Type: "service_unavailable_error", Code: "snapshot_failed",
			Message: "the index snapshot could not be taken", Err: err})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.Header().Set("Kvroute-Snapshot-Version", strconv.Itoa(kvindex.SnapshotVersion))
	_, _ = buf.WriteTo(w)
	r.log.Info("index snapshot served", "bytes", buf.Len(), "entries", r.index.Stats().Entries, "took", time.Since(start).Round(time.Millisecond))
}

// warmStart loads a peer replica's index snapshot before the router turns
// ready: the event consumer is held (its messages queue) until the
// snapshot is loaded and its sequence numbers seeded, so the live tail
// continues exactly after the snapshot. Any failure is logged and the
// router starts cold; a warm start is an optimisation, never a reason not
// to serve.
func (r *Server) warmStart(hold chan struct{}) {
	defer close(hold)
	peer := strings.TrimRight(r.cfg.Recovery.WarmFrom, "/")
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Recovery.WarmTimeout)
	defer cancel()
	st, seqs, err := r.fetchSnapshot(ctx, peer+SnapshotPath)
	if err != nil {
		r.log.Warn("warm start failed; starting with an empty index", "peer", peer, "err", err)
		return
	}
	if r.events != nil {
		r.events.Seed(seqs)
	}
	took := time.Since(start)
	r.metrics.health.warmSeconds.Set(took.Seconds())
	r.metrics.health.warmEntries.Set(float64(st.Entries))
	r.log.Info("index warm-started from a peer", "peer", peer, "workers", st.Workers, "skipped_workers", st.Skipped,
		"entries", st.Entries, "took", took.Round(time.Millisecond))
}

func (r *Server) fetchSnapshot(ctx context.Context, url string) (kvindex.LoadStats, map[string]uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return kvindex.LoadStats{}, nil, err
	}
	if r.cfg.AdminToken != "" {
		// Replicas of one deployment share the admin token.
		req.Header.Set("Authorization", "Bearer "+r.cfg.AdminToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return kvindex.LoadStats{}, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return kvindex.LoadStats{}, nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	s, err := kvindex.ReadSnapshot(resp.Body)
	if err != nil {
		return kvindex.LoadStats{}, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return r.index.LoadSnapshot(s), s.Seqs(), nil
}
