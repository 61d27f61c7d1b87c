package kvindex

import "sync/atomic"

// resultTemplate is what Match answers for one candidate list before it
// knows the prompt: every candidate's result with Blocks 0. On a large
// fleet writing the results is most of a lookup (1,000 of 20 bytes), and
// copying them whole from here costs about half of building them one by
// one; Match then sets Blocks where the walk found any. The Index keeps
// the template of the last list it was asked about and brings it up to
// date under its write lock whenever a worker's counts change (setHot),
// so that events do not make lookups rebuild it.
type resultTemplate struct {
	rc  *resolvedCandidates
	out []MatchResult
	pos []int32 // by slot: the candidate's position, -1 for none
	dup bool    // a worker is listed twice: Match writes results one by one
}

type templateCache struct {
	last atomic.Pointer[resultTemplate]
}

// get returns the template of the candidate list rc, making it if the
// cache holds another. hot is the Index's; the caller holds its read lock.
// Like candidateCache, a template is complete before it is published, and
// changed after only under the write lock.
func (c *templateCache) get(rc *resolvedCandidates, hot []workerHot) *resultTemplate {
	if t := c.last.Load(); t != nil && t.rc == rc {
		return t
	}
	t := &resultTemplate{rc: rc, pos: make([]int32, len(hot))}
	for i := range t.pos {
		t.pos[i] = -1
	}
	for i, s := range rc.slots {
		if s >= 0 {
			if t.pos[s] >= 0 {
				t.dup = true
			}
			t.pos[s] = int32(i)
		}
	}
	if !t.dup {
		t.out = make([]MatchResult, len(rc.slots))
		for i, s := range rc.slots {
			if s < 0 {
				t.out[i].reset(false, false, 0, 0)
			} else {
				t.out[i].reset(true, hot[s].stale, hot[s].blocks, 0)
			}
		}
	}
	c.last.Store(t)
	return t
}

// update brings slot's result in the cached template to h. Caller holds
// the Index's write lock.
func (c *templateCache) update(slot int, h workerHot) {
	t := c.last.Load()
	if t == nil || t.dup || slot >= len(t.pos) || t.pos[slot] < 0 {
		return
	}
	r := &t.out[t.pos[slot]]
	r.Cached, r.Stale = int32(h.blocks), h.stale
}

// fill writes the results of the template's candidates, whose depths by
// slot are depth, into out (of the same length). touched, if not nil,
// lists every slot whose depth is not 0.
func (t *resultTemplate) fill(out []MatchResult, depth, touched []int32) {
	copy(out, t.out)
	pos := t.pos[:len(depth)]
	if touched != nil {
		for _, s := range touched {
			if p := pos[s]; p >= 0 {
				out[p].Blocks = depth[s]
			}
		}
		return
	}
	for s, d := range depth {
		if d != 0 {
			if p := pos[s]; p >= 0 {
				out[p].Blocks = d
			}
		}
	}
}
