package engine

import (
	"fmt"

	"github.com/kvroute/kvroute/engine/vllmzmq"
)

// Action is what a stream must do with a batch that just arrived live from
// the engine, decided by Sequencer.Step.
type Action int

const (
	// Forward: the batch is the next one; republish it.
	Forward Action = iota
	// Drop: the batch was already republished (it arrived through replay
	// while the live stream was catching up).
	Drop
	// Heal: batches are missing between the last republished one and this
	// one; replay them from the engine before republishing this one.
	Heal
	// Reset: the stream's history is unknown or belongs to an earlier engine
	// (the stream just started, the engine restarted, or the connection was
	// lost and the numbers do not simply continue). Publish AllBlocksCleared,
	// replay what the engine still buffers from 0, then republish this one.
	Reset
	// Verify: the connection was lost and the numbers go on from where they
	// were. That is the same engine, or a restarted one whose count happens
	// to have reached the same place; the stream compares the engine's
	// replayed copy of the last republished batch with what it sent to
	// tell, then forwards, heals or resets.
	Verify
)

func (a Action) String() string {
	switch a {
	case Forward:
		return "forward"
	case Drop:
		return "drop"
	case Heal:
		return "heal"
	case Reset:
		return "reset"
	case Verify:
		return "verify"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Sequencer tracks one engine endpoint's sequence numbers. It is pure logic:
// the stream feeds it what happened and does the I/O it asks for. Two
// numbers are kept apart on purpose: the last sequence seen on the live
// socket (PUB/SUB preserves order, so it only goes back when the engine
// restarts) and the last sequence republished (replay can move it ahead of
// the live socket).
type Sequencer struct {
	started   bool
	liveLast  uint64
	fwdLast   uint64
	forwarded bool // fwdLast is meaningful
	lost      bool // the connection dropped since the last live batch
}

// Step classifies a live batch with sequence seq.
func (s *Sequencer) Step(seq uint64) Action {
	lost := s.lost
	s.lost = false
	switch {
	case !s.started:
		return Reset
	case seq <= s.liveLast:
		// The live socket never goes back on its own: a new engine.
		return Reset
	case lost && s.forwarded && seq > s.fwdLast:
		return Verify
	case lost:
		// Nothing to compare against: start over.
		return Reset
	case s.forwarded && seq <= s.fwdLast:
		return Drop
	case s.forwarded && seq == s.fwdLast+1:
		return Forward
	default:
		return Heal
	}
}

// Live records that seq arrived on the live socket (after Step, whatever
// the action).
func (s *Sequencer) Live(seq uint64) {
	s.started = true
	s.liveLast = seq
}

// Forwarded records that the batch seq was republished.
func (s *Sequencer) Forwarded(seq uint64) {
	s.fwdLast = seq
	s.forwarded = true
}

// Cleared records that AllBlocksCleared was published: nothing before the
// next republished batch counts any more.
func (s *Sequencer) Cleared() {
	s.forwarded = false
}

// Resume starts the sequencer as if batch seq had been forwarded (a loaded
// index snapshot holds the engine's batches up to it): later batches up to
// seq are dropped, seq+1 goes on, a higher one heals from the replay
// socket, and 0 (a restarted engine) resets.
func (s *Sequencer) Resume(seq uint64) {
	s.started = true
	s.liveLast = 0
	s.fwdLast, s.forwarded = seq, true
}

// Lost records that the connection to the engine dropped.
func (s *Sequencer) Lost() { s.lost = true }

// Next returns the first sequence number the stream still needs, and false
// when nothing has been republished since the last clear.
func (s *Sequencer) Next() (uint64, bool) {
	if !s.forwarded {
		return 0, false
	}
	return s.fwdLast + 1, true
}

// ContiguousTail returns the longest run of replayed batches (in the order
// the engine sends them, ascending) that ends exactly at end-1 with no hole,
// restricted to sequences in [from, end), and whether that run starts exactly
// at from, i.e. the replay covered everything that was asked for.
func ContiguousTail(replayed []vllmzmq.Replayed, from, end uint64) (tail []vllmzmq.Replayed, complete bool) {
	if end <= from {
		return nil, true
	}
	lo, hi := -1, -1
	for i, r := range replayed {
		if r.Seq >= from && r.Seq < end {
			if lo < 0 {
				lo = i
			}
			hi = i
		}
	}
	if lo < 0 || replayed[hi].Seq != end-1 {
		return nil, false
	}
	start := hi
	for start > lo && replayed[start-1].Seq+1 == replayed[start].Seq {
		start--
	}
	tail = replayed[start : hi+1]
	return tail, tail[0].Seq == from
}
