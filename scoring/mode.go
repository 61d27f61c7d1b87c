package scoring

import (
	"fmt"
	"slices"
	"strings"
)

// OverlapSource tells the caller where a mode wants Candidate overlap from.
type OverlapSource int

const (
	// OverlapNone: the mode ignores overlap; the caller may skip the index.
	OverlapNone OverlapSource = iota
	// OverlapEvents: overlap from the event-fed KV index.
	OverlapEvents
	// OverlapApprox: overlap from the approximate index, which learns from
	// the router's own decisions (Options.Recorder) instead of KV events.
	OverlapApprox
)

// String names the source.
func (s OverlapSource) String() string {
	switch s {
	case OverlapEvents:
		return "events"
	case OverlapApprox:
		return "approx"
	}
	return "none"
}

// Mode chooses a worker among candidates. Implementations are safe for
// concurrent use and must not retain loads.
type Mode interface {
	// Name is the mode's --router-mode name.
	Name() string
	// Overlap says which index, if any, should supply Candidate overlap.
	Overlap() OverlapSource
	// Pick returns the index in loads of the chosen worker; loads is not
	// empty. When exp is not nil Pick records every worker's terms in it.
	// Pick may overwrite the unexported scratch fields of loads.
	Pick(req *Request, loads []Load, exp *Explanation) int
}

// Previewer is a Mode whose Pick changes the mode's own state, such as
// round_robin's counter. Preview returns what Pick would return now without
// changing it; Scheduler.Preview uses it. Modes without such state need not
// implement it.
type Previewer interface {
	Preview(req *Request, loads []Load, exp *Explanation) int
}

var _ Previewer = (*RoundRobin)(nil)

var (
	_ Mode = (*KV)(nil)
	_ Mode = (*Weighted)(nil)
	_ Mode = (*LeastLoaded)(nil)
	_ Mode = (*RoundRobin)(nil)
	_ Mode = (*Random)(nil)
	_ Mode = (*PowerOfTwo)(nil)
)

// Mode names for --router-mode.
const (
	ModeKV              = "kv"
	ModeKVWithoutEvents = "kv_without_events"
	ModeRoundRobin      = "round_robin"
	ModeRandom          = "random"
	ModeLeastLoaded     = "least_loaded"
	ModePowerOfTwo      = "power_of_two"
	ModeWeighted        = "weighted"
)

var modeFactories = map[string]func(o Options) Mode{
	ModeKV:              func(o Options) Mode { return newKV(o, OverlapEvents) },
	ModeKVWithoutEvents: func(o Options) Mode { return newKV(o, OverlapApprox) },
	ModeRoundRobin:      func(o Options) Mode { return &RoundRobin{} },
	ModeRandom:          func(o Options) Mode { return &Random{rand: o.Rand} },
	ModeLeastLoaded:     func(o Options) Mode { return &LeastLoaded{rand: o.Rand} },
	ModePowerOfTwo:      func(o Options) Mode { return &PowerOfTwo{rand: o.Rand} },
	ModeWeighted:        func(o Options) Mode { return &Weighted{rand: o.Rand} },
}

// ModeNames lists the valid --router-mode names, default first.
func ModeNames() []string {
	names := make([]string, 0, len(modeFactories))
	for n := range modeFactories {
		if n != ModeKV {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return append([]string{ModeKV}, names...)
}

// normalizeName accepts "kv-without-events" for "kv_without_events".
func normalizeName(s string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
}

// NewMode builds the mode called name (see ModeNames; '-' and '_' are
// interchangeable) configured by opts: the cost model, weights and
// temperature for the kv modes, the random source for all.
func NewMode(name string, opts Options) (Mode, error) {
	f, ok := modeFactories[normalizeName(name)]
	if !ok {
		return nil, fmt.Errorf("unknown router mode %q (valid: %s)", name, strings.Join(ModeNames(), ", "))
	}
	opts.Mode = name
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return f(opts.withDefaults()), nil
}
