package scoring

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

// peerKey names a peer's request inside the pool, apart from local IDs.
func peerKey(router, id string) string { return router + "\x00" + id }

// Apply applies a peer replica's lifecycle event to the pool, so the peer's
// in-flight load counts like local load. It never re-publishes. Events for
// workers this replica does not know are ignored with an error.
func (p *Pool) Apply(ev fleet.SyncEvent) error {
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("apply sync event: %w", err)
	}
	key := peerKey(ev.Router, ev.ID)
	switch ev.Op {
	case fleet.OpAdd:
		if _, err := p.add(key, ev.Worker, ev.PromptTokens, 0, ev.PrefillTokens, ev.Hashes, 0, false); err != nil {
			return fmt.Errorf("apply sync event from %q: %w", ev.Router, err)
		}
	case fleet.OpPrefillDone:
		if p.prefillDone(key) {
			p.capacityChanged()
		}
	case fleet.OpProgress:
		if _, done := p.progress(key, ev.OutputTokens); done {
			p.capacityChanged()
		}
	case fleet.OpFree:
		if p.free(key) {
			p.capacityChanged()
		}
	case fleet.OpMove:
		moved, err := p.move(key, ev.Worker)
		if err != nil {
			return fmt.Errorf("apply sync event from %q: %w", ev.Router, err)
		}
		if moved {
			p.capacityChanged()
		}
	case fleet.OpReset:
		if p.resetPeer(ev.Router) > 0 {
			p.capacityChanged()
		}
	case fleet.OpHeartbeat:
		// Liveness is tracked by the sync adapter (bus), which
		// calls DropPeer when a router falls silent.
	}
	return nil
}

// DropPeer drops every in-flight request a peer router added, for when the
// peer fell silent (missed heartbeats) and is presumed dead. It returns how
// many requests it dropped.
func (p *Pool) DropPeer(router string) int {
	n := p.resetPeer(router)
	if n > 0 {
		p.capacityChanged()
	}
	return n
}

// phantomGrace is how old a peer's request must be before a worker's idle
// load report may clear it: younger ones may not have reached the worker
// when the report was taken.
const phantomGrace = time.Second

// clearPhantomsLocked drops the peer requests on w older than phantomGrace,
// after w reported nothing running or waiting: a peer that died or lost a
// Free left them behind. Local requests are left to their streams.
func (p *Pool) clearPhantomsLocked(w *worker, now time.Time) int {
	if w.requests == 0 {
		return 0
	}
	n := 0
	for key, a := range p.reqs {
		if a.w != w || !strings.Contains(key, "\x00") || now.Sub(a.addAt) < phantomGrace {
			continue
		}
		p.releaseLocked(a)
		delete(p.reqs, key)
		p.tomb.add(key)
		n++
	}
	return n
}

// resetPeer drops every request a peer router added.
func (p *Pool) resetPeer(router string) int {
	prefix := router + "\x00"
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for key, a := range p.reqs {
		if strings.HasPrefix(key, prefix) {
			p.releaseLocked(a)
			p.summarizeLocked(a.w)
			delete(p.reqs, key)
			n++
		}
	}
	return n
}

// emit hands a local event to the replica sync publisher, if any.
func (p *Pool) emit(ev fleet.SyncEvent) {
	if ev.Op == "" {
		return
	}
	if f := p.sink.Load(); f != nil {
		(*f)(ev)
	}
}

// SetSink hands the pool's local lifecycle events to f (the replica sync
// publisher), or to nobody when f is nil. f must not block.
func (p *Pool) SetSink(f func(fleet.SyncEvent)) {
	if f == nil {
		p.sink.Store(nil)
		return
	}
	p.sink.Store(&f)
}

// Metrics returns the pool's metrics, for the adapters that feed it.
func (p *Pool) Metrics() Metrics { return p.opts.Metrics }
