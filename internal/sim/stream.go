package sim

import (
	"sync"
	"time"
)

// stream carries one request's generated tokens from the worker loop to the
// HTTP handler waiting for them. The loop appends under mu and pokes
// notify; the handler drains under mu.
type stream struct {
	mu           sync.Mutex
	tokens       []int32
	times        []time.Time // when each token was produced
	promptTokens int
	cachedTokens int
	finished     bool
	// err is set when the worker stops before the request finished.
	err    error
	notify chan struct{}
}

func newStream(maxTokens int) *stream {
	return &stream{tokens: make([]int32, 0, maxTokens), times: make([]time.Time, 0, maxTokens), notify: make(chan struct{}, 1)}
}

func (s *stream) poke() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// deliver appends one output; called by the worker loop.
func (s *stream) deliver(o Output, at time.Time) {
	s.mu.Lock()
	s.tokens = append(s.tokens, o.Token)
	s.times = append(s.times, at)
	s.promptTokens, s.cachedTokens = o.PromptTokens, o.CachedTokens
	s.finished = o.Finished
	s.mu.Unlock()
	s.poke()
}

// fail ends the stream with err; called by the worker loop.
func (s *stream) fail(err error) {
	s.mu.Lock()
	if !s.finished && s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.poke()
}

// snapshot is what a handler reads after a poke.
type snapshot struct {
	tokens       []int32 // tokens from the requested offset on
	times        []time.Time
	promptTokens int
	cachedTokens int
	finished     bool
	err          error
}

// since returns the tokens (and their times) from index from on, appended
// to buf and tbuf.
func (s *stream) since(from int, buf []int32, tbuf []time.Time) snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var toks []int32
	var times []time.Time
	if from < len(s.tokens) {
		toks = append(buf[:0], s.tokens[from:]...)
		times = append(tbuf[:0], s.times[from:]...)
	}
	return snapshot{tokens: toks, times: times, promptTokens: s.promptTokens, cachedTokens: s.cachedTokens, finished: s.finished, err: s.err}
}
