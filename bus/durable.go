package bus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// EventStreamName is the JetStream stream that captures namespace ns's KV
// events (subjects EventsWildcard(ns)) when --durable-events is on.
func EventStreamName(ns string) string { return "kvroute-" + ns + "-events" }

// SnapshotBucket is the NATS object store bucket holding namespace ns's
// index snapshots.
func SnapshotBucket(ns string) string { return "kvroute-" + ns + "-index" }

// snapshotObjectPrefix starts every snapshot object's name; the writing
// replica's router id follows, so replicas never overwrite each other.
const snapshotObjectPrefix = "snapshot."

// Snapshot object metadata keys.
const (
	metaStreamSeq = "kvroute-stream-seq" // stream sequence the snapshot covers, decimal
	metaVersion   = "kvroute-snapshot-version"
	metaRouter    = "kvroute-router"
	metaTakenAt   = "kvroute-taken-at" // RFC 3339, UTC
)

// EventStreamLimits bound the durable event stream: messages older than
// MaxAge, or beyond MaxBytes in total, are discarded oldest first.
type EventStreamLimits struct {
	MaxAge   time.Duration
	MaxBytes int64
	Replicas int // stream replicas in a JetStream cluster; 0 means 1
}

// EnsureEventStream creates namespace ns's event stream, or updates its
// limits, and returns it. Several replicas may call it at once.
func EnsureEventStream(ctx context.Context, js jetstream.JetStream, ns string, lim EventStreamLimits) (jetstream.Stream, error) {
	cfg := jetstream.StreamConfig{
		Name:        EventStreamName(ns),
		Description: "kvroute KV events of namespace " + ns,
		Subjects:    []string{EventsWildcard(ns)},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     jetstream.FileStorage,
		MaxAge:      lim.MaxAge,
		MaxBytes:    lim.MaxBytes,
		Replicas:    max(lim.Replicas, 1),
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = -1
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamSubjectOverlap {
		other, _ := js.StreamNameBySubject(ctx, cfg.Subjects[0])
		return nil, fmt.Errorf("jetstream stream %s: %w: stream %q already captures subjects of %s; "+
			"narrow that stream's subjects (kvroute makes its own stream) or run without --durable-events: %v",
			cfg.Name, ErrEventSubjectsTaken, other, cfg.Subjects[0], err)
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// ErrEventSubjectsTaken is wrapped by EnsureEventStream's error when another
// stream on the NATS server already captures the namespace's event subjects:
// JetStream lets no two streams overlap.
var ErrEventSubjectsTaken = errors.New("event subjects taken by another stream")

// errCodeStreamSubjectOverlap is the JetStream API error code of a stream
// whose subjects overlap an existing stream's (nats-server's
// JSStreamSubjectOverlapErr).
const errCodeStreamSubjectOverlap jetstream.ErrorCode = 10065

// SnapshotMeta describes one stored index snapshot.
type SnapshotMeta struct {
	StreamSeq uint64 // the snapshot holds exactly the stream's messages up to here
	Version   int    // kvindex.SnapshotVersion of the body
	Router    string
	TakenAt   time.Time
}

// Metadata is m as object metadata.
func (m SnapshotMeta) Metadata() map[string]string {
	return map[string]string{
		metaStreamSeq: strconv.FormatUint(m.StreamSeq, 10),
		metaVersion:   strconv.Itoa(m.Version),
		metaRouter:    m.Router,
		metaTakenAt:   m.TakenAt.UTC().Format(time.RFC3339Nano),
	}
}

// ErrSnapshotMeta is wrapped by ParseSnapshotMeta's errors.
var ErrSnapshotMeta = errors.New("index snapshot metadata")

// ParseSnapshotMeta reads a snapshot object's metadata: the stream
// sequence and version must be there and decimal; router and time are
// informational (an unparsable time is zero).
func ParseSnapshotMeta(md map[string]string) (SnapshotMeta, error) {
	var m SnapshotMeta
	seq, ok := md[metaStreamSeq]
	if !ok {
		return m, fmt.Errorf("%w: no %s", ErrSnapshotMeta, metaStreamSeq)
	}
	var err error
	if m.StreamSeq, err = strconv.ParseUint(seq, 10, 64); err != nil {
		return m, fmt.Errorf("%w: %s %q is not a sequence number", ErrSnapshotMeta, metaStreamSeq, seq)
	}
	v, ok := md[metaVersion]
	if !ok {
		return m, fmt.Errorf("%w: no %s", ErrSnapshotMeta, metaVersion)
	}
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return m, fmt.Errorf("%w: %s %q is not a version", ErrSnapshotMeta, metaVersion, v)
	}
	m.Version = int(n)
	m.Router = md[metaRouter]
	if len(m.Router) > 256 {
		m.Router = m.Router[:256]
	}
	m.TakenAt, _ = time.Parse(time.RFC3339Nano, md[metaTakenAt])
	return m, nil
}

// SnapshotStore keeps index snapshots in a NATS object store bucket. Each
// replica writes its own object; a reader takes the one covering the
// highest stream sequence, so the newest wins whoever wrote it.
type SnapshotStore struct {
	obs jetstream.ObjectStore
}

// OpenSnapshotStore creates or opens namespace ns's snapshot bucket.
func OpenSnapshotStore(ctx context.Context, js jetstream.JetStream, ns string, replicas int) (*SnapshotStore, error) {
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: SnapshotBucket(ns), Description: "kvroute index snapshots of namespace " + ns,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", SnapshotBucket(ns), err)
	}
	return &SnapshotStore{obs: obs}, nil
}

// Put stores body as router's snapshot, then deletes other replicas'
// snapshots that cover a lower stream sequence (superseded).
func (s *SnapshotStore) Put(ctx context.Context, m SnapshotMeta, body []byte) error {
	name := snapshotObjectPrefix + m.Router
	if _, err := s.obs.Put(ctx, jetstream.ObjectMeta{Name: name, Metadata: m.Metadata()}, bytes.NewReader(body)); err != nil {
		return fmt.Errorf("put snapshot %s: %w", name, err)
	}
	infos, err := s.list(ctx)
	if err != nil {
		return nil //nolint:nilerr // stored; the clean-up can wait for the next one
	}
	for _, in := range infos {
		if in.name != name && in.meta.StreamSeq < m.StreamSeq {
			_ = s.obs.Delete(ctx, in.name)
		}
	}
	return nil
}

type storedSnapshot struct {
	name string
	meta SnapshotMeta
	size uint64
}

func (s *SnapshotStore) list(ctx context.Context) ([]storedSnapshot, error) {
	infos, err := s.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []storedSnapshot
	for _, in := range infos {
		if in.Deleted || len(in.Name) <= len(snapshotObjectPrefix) || in.Name[:len(snapshotObjectPrefix)] != snapshotObjectPrefix {
			continue
		}
		m, err := ParseSnapshotMeta(in.Metadata)
		if err != nil {
			continue
		}
		out = append(out, storedSnapshot{name: in.Name, meta: m, size: in.Size})
	}
	return out, nil
}

// ErrNoSnapshot is returned by Newest when the bucket holds no snapshot.
var ErrNoSnapshot = errors.New("no index snapshot stored")

// Newest opens the snapshot covering the highest stream sequence; the
// caller reads the body (kvindex.ReadSnapshot) and closes it.
func (s *SnapshotStore) Newest(ctx context.Context) (SnapshotMeta, uint64, io.ReadCloser, error) {
	infos, err := s.list(ctx)
	if err != nil {
		return SnapshotMeta{}, 0, nil, fmt.Errorf("list snapshots: %w", err)
	}
	var best *storedSnapshot
	for i := range infos {
		if best == nil || infos[i].meta.StreamSeq > best.meta.StreamSeq {
			best = &infos[i]
		}
	}
	if best == nil {
		return SnapshotMeta{}, 0, nil, ErrNoSnapshot
	}
	r, err := s.obs.Get(ctx, best.name)
	if err != nil {
		return SnapshotMeta{}, 0, nil, fmt.Errorf("get snapshot %s: %w", best.name, err)
	}
	return best.meta, best.size, r, nil
}
