package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// piece is a stretch of text on its way to the model. first marks the piece
// that starts the original text (Metaspace's "first" prepend scheme).
type piece struct {
	text  string
	first bool
}

// preStep is one pre-tokenizer: it cuts a piece into smaller pieces,
// appending them to dst. Pieces are substrings of their input where possible.
type preStep interface {
	apply(st *encodeState, p piece, dst []piece) []piece
}

var (
	_ preStep = (*splitStep)(nil)
	_ preStep = (*charSplitStep)(nil)
	_ preStep = (*byteLevelStep)(nil)
	_ preStep = (*metaspaceStep)(nil)
	_ preStep = whitespaceStep{}
)

// preChain is the flattened pre-tokenizer sequence of a tokenizer.
type preChain struct {
	steps []preStep
	// isolators holds the scanner of every step when each one is an
	// isolating split with a hand-written scanner (DeepSeek-V3's chain once
	// its ByteLevel step is dropped), so the chain can be streamed by
	// isolateChainEach; otherwise nil. Set by withoutIdentity.
	isolators []isolator
}

// run applies every step to every piece in turn, like the reference's
// Sequence, and returns the final pieces (valid until the next run on st).
func (c *preChain) run(st *encodeState, p piece) []piece {
	cur := append(st.pieces[0][:0], p)
	spare := st.pieces[1]
	for _, step := range c.steps {
		next := spare[:0]
		for _, q := range cur {
			next = step.apply(st, q, next)
		}
		spare, cur = cur, next
	}
	st.pieces[0], st.pieces[1] = cur, spare
	return cur
}

// splitBehavior says what happens to the matches of a Split pattern.
type splitBehavior int

const (
	isolated splitBehavior = iota
	removed
	mergedWithPrevious
	mergedWithNext
	contiguous
)

// span is a stretch of a piece and whether the pattern matched it.
type span struct {
	start, end int
	match      bool
}

// splitSpans turns the match offsets locs of s into the pieces the
// reference's NormalizedString::split keeps for behavior b.
func splitSpans(s string, locs []int, invert bool, b splitBehavior, first bool, dst []piece) []piece {
	var buf [64]span
	spans := buf[:0]
	prev := 0
	for k := 0; k < len(locs); k += 2 {
		if prev < locs[k] {
			spans = append(spans, span{prev, locs[k], invert})
		}
		spans = append(spans, span{locs[k], locs[k+1], !invert})
		prev = locs[k+1]
	}
	if prev < len(s) {
		spans = append(spans, span{prev, len(s), invert})
	}
	var out []span
	switch b {
	case isolated, removed:
		out = spans
	case contiguous, mergedWithPrevious:
		out = spans[:0:0]
		prevMatch := false
		for _, sp := range spans {
			merge := sp.match == prevMatch
			if b == mergedWithPrevious {
				merge = sp.match && !prevMatch
			}
			if merge && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
	case mergedWithNext:
		out = make([]span, 0, len(spans))
		prevMatch := false
		for k := len(spans) - 1; k >= 0; k-- {
			sp := spans[k]
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
		for l, r := 0, len(out)-1; l < r; l, r = l+1, r-1 {
			out[l], out[r] = out[r], out[l]
		}
	}
	for _, sp := range out {
		if sp.end <= sp.start || (b == removed && sp.match) {
			continue
		}
		dst = append(dst, piece{text: s[sp.start:sp.end], first: first && sp.start == 0})
	}
	return dst
}

// splitStep is the Split pre-tokenizer.
type splitStep struct {
	m        *matcher
	behavior splitBehavior
	invert   bool
}

func (sp *splitStep) apply(st *encodeState, p piece, dst []piece) []piece {
	if !sp.invert && sp.behavior == isolated && sp.m.scan != nil {
		// Fast path: every match and every gap becomes a piece.
		return isolate(p.text, p.first, sp.m.scan, dst)
	}
	st.locs = sp.m.findAll(p.text, st.locs[:0])
	return splitSpans(p.text, st.locs, sp.invert, sp.behavior, p.first, dst)
}

// isolate appends every match of scan in s and every gap between matches
// as pieces (Split with behavior Isolated). first marks the piece that
// starts s when s starts the input.
func isolate(s string, first bool, scan scanFunc, dst []piece) []piece {
	isolateEach(s, scan, func(a, b int) {
		dst = append(dst, piece{text: s[a:b], first: first && a == 0})
	})
	return dst
}

// isolateEach calls yield with the bounds of every match of scan in s and
// every gap between matches, in order. scan returns the end of the match at
// i, or a value <= i for none; a position without a match moves on by one
// rune.
func isolateEach(s string, scan scanFunc, yield func(start, end int)) {
	isolateLast(s, 0, scan, nil, yield)
}

// soleIsolate returns the scanner of the chain's only step when that step
// is an isolating split (every byte-level model's chain once its ByteLevel
// step is dropped), so pieces can go to the model as they are cut, without
// building the piece list; otherwise nil.
func (c *preChain) soleIsolate() scanFunc {
	if c == nil || len(c.steps) != 1 {
		return nil
	}
	if sp, ok := c.steps[0].(*splitStep); ok && !sp.invert && sp.behavior == isolated && sp.m.scan != nil {
		return sp.m.scan
	}
	return nil
}

// isolator is one isolating split of a streamed chain: its scanner and,
// when the pattern can only start at a few runes, a skip that jumps to the
// next position where it may match (nil to try every rune).
type isolator struct {
	scan scanFunc
	skip skipFunc
}

// chainIsolators returns the isolators of steps when every step is an
// isolating split with a scanner, and nil otherwise.
func chainIsolators(steps []preStep) []isolator {
	var out []isolator
	for _, s := range steps {
		sp, ok := s.(*splitStep)
		if !ok || sp.invert || sp.behavior != isolated || sp.m.scan == nil {
			return nil
		}
		out = append(out, isolator{scan: sp.m.scan, skip: sp.m.skip})
	}
	return out
}

// isolateChainEach calls yield with the bounds in s of every piece a chain
// of isolating splits cuts s into, in order, giving the same pieces as
// preChain.run without building a piece list per step: each piece of step
// k is cut by step k+1 as soon as it is found, and the last step's pieces go
// to yield. Where the first flag matters, it belongs to the piece at 0, as
// in run (an isolating split passes it to a piece's first part only).
func isolateChainEach(s string, steps []isolator, yield func(start, end int)) {
	if len(steps) == 0 {
		if s != "" {
			yield(0, len(s))
		}
		return
	}
	isolateNested(s, 0, steps, yield)
}

// isolateNested cuts s, which lies at off in the text, with steps[0] and
// hands each piece to the remaining steps. The scanner sees the piece alone,
// as the reference's next split does (its lookaheads stop at the piece's end).
// Its loop is isolateLast's with direct recursive calls in place of yield:
// passing isolateLast a closure that recurses made DeepSeek-V3's
// pre-tokenizing 6 % slower (seven interleaved rounds).
func isolateNested(s string, off int, steps []isolator, yield func(start, end int)) {
	scan, skip, rest := steps[0].scan, steps[0].skip, steps[1:]
	if len(rest) == 0 {
		isolateLast(s, off, scan, skip, yield)
		return
	}
	gap := 0
	for i := 0; i < len(s); {
		if skip != nil {
			if i = skip(s, i); i >= len(s) {
				break
			}
		}
		e := scan(s, i)
		if e <= i {
			_, n := decode(s, i)
			i += n
			continue
		}
		if gap < i {
			isolateNested(s[gap:i], off+gap, rest, yield)
		}
		isolateNested(s[i:e], off+i, rest, yield)
		i, gap = e, e
	}
	if gap < len(s) {
		isolateNested(s[gap:], off+gap, rest, yield)
	}
}

// isolateLast is isolateNested for the last step, which gives its pieces,
// the most numerous, straight to yield.
func isolateLast(s string, off int, scan scanFunc, skip skipFunc, yield func(start, end int)) {
	gap := 0
	for i := 0; i < len(s); {
		if skip != nil {
			if i = skip(s, i); i >= len(s) {
				break
			}
		}
		e := scan(s, i)
		if e <= i {
			_, n := decode(s, i)
			i += n
			continue
		}
		if gap < i {
			yield(off+gap, off+i)
		}
		yield(off+i, off+e)
		i, gap = e, e
	}
	if gap < len(s) {
		yield(off+gap, off+len(s))
	}
}

// charSplitStep splits on single characters chosen by a predicate (Digits,
// Punctuation, WhitespaceSplit, Metaspace's split).
type charSplitStep struct {
	pred     func(rune) bool
	behavior splitBehavior
}

func (cs *charSplitStep) apply(st *encodeState, p piece, dst []piece) []piece {
	locs := st.locs[:0]
	for i, r := range p.text {
		if cs.pred(r) {
			locs = append(locs, i, i+utf8.RuneLen(r))
		}
	}
	st.locs = locs
	return splitSpans(p.text, locs, false, cs.behavior, p.first, dst)
}

// byteLevelStep is the ByteLevel pre-tokenizer. When the model runs on raw
// bytes (the usual case) the byte-to-rune mapping is skipped.
type byteLevelStep struct {
	addPrefixSpace bool
	useRegex       bool
	mapBytes       bool
}

func (bl *byteLevelStep) apply(st *encodeState, p piece, dst []piece) []piece {
	s := p.text
	if bl.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	start := len(dst)
	if bl.useRegex {
		dst = isolate(s, p.first, scanGPT2, dst)
	} else if s != "" {
		dst = append(dst, piece{text: s, first: p.first})
	}
	if bl.mapBytes {
		for k := start; k < len(dst); k++ {
			dst[k].text = byteLevelEncode(dst[k].text)
		}
	}
	return dst
}

// metaspaceStep is the Metaspace pre-tokenizer of SentencePiece models.
type metaspaceStep struct {
	replacement rune
	repl        string
	prepend     string // "always", "first" or "never"
	split       bool
}

func (ms *metaspaceStep) apply(st *encodeState, p piece, dst []piece) []piece {
	s := strings.ReplaceAll(p.text, " ", ms.repl)
	if !strings.HasPrefix(s, ms.repl) && (ms.prepend == "always" || (ms.prepend == "first" && p.first)) {
		s = ms.repl + s
	}
	if !ms.split {
		if s != "" {
			dst = append(dst, piece{text: s, first: p.first})
		}
		return dst
	}
	locs := st.locs[:0]
	for i, r := range s {
		if r == ms.replacement {
			locs = append(locs, i, i+len(ms.repl))
		}
	}
	st.locs = locs
	return splitSpans(s, locs, false, mergedWithNext, p.first, dst)
}

// whitespaceStep is the Whitespace pre-tokenizer: \w+|[^\w\s]+ runs.
type whitespaceStep struct{}

func (whitespaceStep) apply(st *encodeState, p piece, dst []piece) []piece {
	s := p.text
	for i := 0; i < len(s); {
		r, n := decode(s, i)
		var f func(rune) bool
		switch {
		case isWordRune(r):
			f = isWordRune
		case !unicode.IsSpace(r):
			f = func(r rune) bool { return !isWordRune(r) && !unicode.IsSpace(r) }
		default:
			i += n
			continue
		}
		e := runWhile(s, i, f)
		dst = append(dst, piece{text: s[i:e], first: p.first && i == 0})
		i = e
	}
	return dst
}

// isPunctuation is Rust's c.is_ascii_punctuation() || c.is_punctuation().
func isPunctuation(r rune) bool {
	if r < 128 {
		return (r >= '!' && r <= '/') || (r >= ':' && r <= '@') || (r >= '[' && r <= '`') || (r >= '{' && r <= '~')
	}
	return unicode.IsPunct(r)
}
