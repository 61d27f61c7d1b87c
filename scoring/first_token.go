package scoring

import "github.com/kvroute/kvroute/fleet"

// A request's first token from its worker's KV events. An engine caches a
// prompt block once the step that computed it ends, and the step that
// computes a prompt's last block also samples the first token, so the
// BlockStored that names the prompt's last full block marks the end of its
// prefill; vLLM publishes a step's events right after the step, with the
// token. The response does not time it as well: vLLM's and SGLang's OpenAI
// servers send a streamed answer's headers before its first token, and a
// whole answer's first byte comes with its last token.
//
// So a local request in prefill whose last full prompt block the index did
// not hold at dispatch waits on its worker for that block, once the worker's
// events have shown it stores blocks at all. Whichever comes first ends its
// prefill: the block's BlockStored (timed: it teaches the rate fit), the
// first response body chunk (timed), or the end of the request. The response
// headers alone (ResponseStarted) end the prefill only of a request that
// waits on no block, and untimed. A request that waits on no block: a prompt
// shorter than one block, one whose last block the worker held already, a
// peer's request, a worker that never reported a stored block. A gap in the
// worker's events (CacheReset) stops the waiting.

// awaitLocked makes a, just charged to its worker, wait for its last prompt
// block there when that block was not among the first indexed blocks the
// index held.
func (p *Pool) awaitLocked(a *active, indexed int) {
	w, n := a.w, len(a.hashes)
	if !w.storesBlocks || a.prefillTokens == 0 || n == 0 || indexed >= n {
		return
	}
	h := a.hashes[n-1]
	if w.awaiting == nil {
		w.awaiting = make(map[uint64]*active)
	}
	a.awaiting, a.awaitNext = true, w.awaiting[h]
	w.awaiting[h] = a
}

// unawaitLocked takes a off its worker's waiting list, if it is on it.
func (p *Pool) unawaitLocked(a *active) {
	if !a.awaiting {
		return
	}
	w, h := a.w, a.hashes[len(a.hashes)-1]
	switch head := w.awaiting[h]; {
	case head == a && a.awaitNext == nil:
		delete(w.awaiting, h)
	case head == a:
		w.awaiting[h] = a.awaitNext
	default:
		for x := head; x != nil; x = x.awaitNext {
			if x.awaitNext == a {
				x.awaitNext = a.awaitNext
				break
			}
		}
	}
	a.awaiting, a.awaitNext, a.responded = false, nil, false
}

// storedLocked ends the prefill of the requests on w that wait for one of
// hashes, and appends their keys to done.
func (p *Pool) storedLocked(w *worker, hashes []uint64, done []string) []string {
	now := p.opts.Now()
	for _, h := range hashes {
		a := w.awaiting[h]
		if a == nil {
			continue
		}
		delete(w.awaiting, h)
		for a != nil {
			next := a.awaitNext
			a.awaiting, a.awaitNext, a.responded = false, nil, false
			a.lastSeen = now
			if p.clearPrefillLocked(a, now) {
				done = append(done, a.key)
			}
			a = next
		}
	}
	return done
}

// resetAwaitingLocked stops every request on w from waiting for a block,
// after a gap in w's events: those whose response started end their
// prefill now, untimed; the others wait for their response.
func (p *Pool) resetAwaitingLocked(w *worker, done []string) []string {
	if len(w.awaiting) == 0 {
		return done
	}
	now := p.opts.Now()
	for h, a := range w.awaiting {
		delete(w.awaiting, h)
		for a != nil {
			next := a.awaitNext
			responded := a.responded
			a.awaiting, a.awaitNext, a.responded = false, nil, false
			if responded {
				a.fitX = -1
				if p.clearPrefillLocked(a, now) {
					done = append(done, a.key)
				}
			}
			a = next
		}
	}
	return done
}

// firstTokens tells the metrics and peers about the requests whose prefill
// the worker's events ended. It runs under the KV index's lock
// (kvindex.Observer), which a pick takes, so the admission queue is woken
// later: by AfterApply, or by the next Sweep.
func (p *Pool) firstTokens(done []string, signal string) {
	if len(done) == 0 {
		return
	}
	for _, key := range done {
		p.opts.Metrics.FirstToken(signal)
		p.emit(fleet.SyncEvent{Op: fleet.OpPrefillDone, ID: key})
	}
	p.kickOwed.Store(true)
}

// AfterApply wakes the admission queue when the batch of KV events just
// applied ended a request's prefill. The KV index calls it with its lock
// released (kvindex.AfterApplier).
func (p *Pool) AfterApply() {
	if p.kickOwed.Load() && p.kickOwed.Swap(false) {
		p.capacityChanged()
	}
}

// ResponseStarted records that the request's response began while the
// router sees no more of it than the headers (a response path without its
// body). The engines' OpenAI servers send a streamed answer's headers
// before its first token and a whole answer's with its last, so the time
// says nothing about the prefill: a request waiting for its last prompt
// block in its worker's events keeps waiting, and any other's prefill ends
// now without teaching the rate fit. Unknown or finished IDs are ignored.
func (p *Pool) ResponseStarted(id string) {
	if p.responseStarted(id) {
		p.opts.Metrics.FirstToken(FirstTokenResponseHeaders)
		p.emit(fleet.SyncEvent{Op: fleet.OpPrefillDone, ID: id})
		p.capacityChanged()
	}
}

func (p *Pool) responseStarted(key string) bool {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.reqs[key]
	if !ok {
		return false
	}
	a.lastSeen = now
	if a.awaiting {
		a.responded = true
		return false
	}
	a.fitX = -1
	defer p.summarizeLocked(a.w)
	return p.clearPrefillLocked(a, now)
}

// Signals that end a request's prefill, for Metrics.FirstToken.
const (
	// FirstTokenKVEvent: the worker's BlockStored for the prompt's last
	// full block.
	FirstTokenKVEvent = "kv_event"
	// FirstTokenResponse: the first response body chunk or streamed event.
	FirstTokenResponse = "response_body"
	// FirstTokenResponseHeaders: the response headers, with no body shown
	// and no block to wait for (untimed).
	FirstTokenResponseHeaders = "response_headers"
	// FirstTokenEventGap: a gap in the worker's events ended the wait of a
	// request whose response had started (untimed).
	FirstTokenEventGap = "event_gap"
)
