package scoring

import "sync/atomic"

// RoundRobin cycles through the candidates in order, ignoring load and
// cache. One counter serves every model.
type RoundRobin struct{ next atomic.Uint64 }

// Name implements Mode.
func (*RoundRobin) Name() string { return ModeRoundRobin }

// Overlap implements Mode.
func (*RoundRobin) Overlap() OverlapSource { return OverlapNone }

// Pick implements Mode.
func (m *RoundRobin) Pick(req *Request, loads []Load, exp *Explanation) int {
	idx := int((m.next.Add(1) - 1) % uint64(len(loads)))
	explainLoads(ModeRoundRobin, req, loads, idx, exp, nil)
	return idx
}

// Preview implements Previewer: the candidate Pick would answer next,
// leaving the counter where it is.
func (m *RoundRobin) Preview(req *Request, loads []Load, exp *Explanation) int {
	idx := int(m.next.Load() % uint64(len(loads)))
	explainLoads(ModeRoundRobin, req, loads, idx, exp, nil)
	return idx
}

// Random picks a candidate uniformly at random.
type Random struct{ rand Rand }

// Name implements Mode.
func (*Random) Name() string { return ModeRandom }

// Overlap implements Mode.
func (*Random) Overlap() OverlapSource { return OverlapNone }

// Pick implements Mode.
func (m *Random) Pick(req *Request, loads []Load, exp *Explanation) int {
	idx := m.rand.IntN(len(loads))
	explainLoads(ModeRandom, req, loads, idx, exp, nil)
	return idx
}

// lessLoaded orders by active blocks, then active requests.
func lessLoaded(a, b *Load) int {
	switch {
	case a.ActiveBlocks != b.ActiveBlocks:
		return cmpInt(a.ActiveBlocks, b.ActiveBlocks)
	default:
		return cmpInt(a.ActiveRequests, b.ActiveRequests)
	}
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// LeastLoaded picks the candidate with the fewest active blocks, then the
// fewest active requests; remaining ties go uniformly at random.
type LeastLoaded struct{ rand Rand }

// Name implements Mode.
func (*LeastLoaded) Name() string { return ModeLeastLoaded }

// Overlap implements Mode.
func (*LeastLoaded) Overlap() OverlapSource { return OverlapNone }

// Pick implements Mode.
func (m *LeastLoaded) Pick(req *Request, loads []Load, exp *Explanation) int {
	best, ties := 0, 1
	for i := 1; i < len(loads); i++ {
		switch c := lessLoaded(&loads[i], &loads[best]); {
		case c < 0:
			best, ties = i, 1
		case c == 0:
			ties++
			if m.rand.IntN(ties) == 0 {
				best = i
			}
		}
	}
	explainLoads(ModeLeastLoaded, req, loads, best, exp, nil)
	return best
}

// PowerOfTwo draws two distinct candidates at random and takes the less
// loaded (active blocks, then active requests; the first drawn on a tie).
type PowerOfTwo struct{ rand Rand }

// Name implements Mode.
func (*PowerOfTwo) Name() string { return ModePowerOfTwo }

// Overlap implements Mode.
func (*PowerOfTwo) Overlap() OverlapSource { return OverlapNone }

// Pick implements Mode.
func (m *PowerOfTwo) Pick(req *Request, loads []Load, exp *Explanation) int {
	idx := 0
	if n := len(loads); n > 1 {
		i := m.rand.IntN(n)
		j := m.rand.IntN(n - 1)
		if j >= i {
			j++
		}
		idx = i
		if lessLoaded(&loads[j], &loads[i]) < 0 {
			idx = j
		}
	}
	explainLoads(ModePowerOfTwo, req, loads, idx, exp, nil)
	return idx
}

// Weighted picks at random with probability proportional to each worker's
// declared weight, for fleets of unequal devices.
type Weighted struct{ rand Rand }

// Name implements Mode.
func (*Weighted) Name() string { return ModeWeighted }

// Overlap implements Mode.
func (*Weighted) Overlap() OverlapSource { return OverlapNone }

// Pick implements Mode.
func (m *Weighted) Pick(req *Request, loads []Load, exp *Explanation) int {
	var sum float64
	for i := range loads {
		sum += loads[i].Weight
	}
	idx := len(loads) - 1
	if sum <= 0 {
		idx = m.rand.IntN(len(loads))
	} else {
		u := m.rand.Float64() * sum
		for i := range loads {
			u -= loads[i].Weight
			if u < 0 {
				idx = i
				break
			}
		}
	}
	explainLoads(ModeWeighted, req, loads, idx, exp, func(l *Load) float64 {
		if sum <= 0 {
			return 1 / float64(len(loads))
		}
		return l.Weight / sum
	})
	return idx
}

// explainLoads records the load terms of a mode without a cost model.
func explainLoads(mode string, req *Request, loads []Load, idx int, exp *Explanation, prob func(*Load) float64) {
	if exp == nil {
		return
	}
	exp.begin(mode, req, 0, loads[idx].ID)
	for i := range loads {
		t := termsFromLoad(&loads[i])
		if prob != nil {
			t.Probability = prob(&loads[i])
		}
		exp.Workers = append(exp.Workers, t)
	}
}
