package sim

import (
	"math"
	"math/rand/v2"
	"time"
)

// TimingModel turns an engine step into simulated GPU time. The default is
// the polynomial fit published with NVIDIA Dynamo's mocker:
//
//	step_ms   = prefill_ms(T) + decode_ms(p)
//	prefill_ms(T) = 4.209989e-7·T² + 1.518344e-2·T + 16.50142   (0 when T = 0)
//	decode_ms(p)  = max(1, −25.74·p² + 54.01·p + 5.74)
//
// where T is the step's uncached prefill tokens and p the fraction of KV
// capacity (in tokens) held by running requests. Speedup divides the result;
// Jitter, when positive, multiplies it by a factor drawn uniformly from
// [1−Jitter, 1+Jitter] with a seeded source.
type TimingModel struct {
	// Speedup divides every duration; zero means 1.
	Speedup float64
	// Jitter is the relative spread of each step's duration, 0 for none.
	Jitter float64
	rng    *rand.Rand
}

// NewTimingModel returns the default model with the given speedup, jitter
// and jitter seed.
func NewTimingModel(speedup, jitter float64, seed uint64) *TimingModel {
	return &TimingModel{Speedup: speedup, Jitter: jitter, rng: rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))}
}

// PrefillMillis is prefill_ms(T).
func PrefillMillis(t int) float64 {
	if t <= 0 {
		return 0
	}
	x := float64(t)
	return 4.209989e-7*x*x + 1.518344e-2*x + 16.50142
}

// DecodeMillis is decode_ms(p).
func DecodeMillis(p float64) float64 {
	return math.Max(1, -25.74*p*p+54.01*p+5.74)
}

// StepMillis returns the unscaled, unjittered duration of a step in
// milliseconds, or 0 when the step scheduled nothing.
func StepMillis(res *StepResult, totalKVTokens int) float64 {
	if res.Scheduled == 0 {
		return 0
	}
	p := 0.0
	if totalKVTokens > 0 {
		p = float64(res.ActiveKVTokens) / float64(totalKVTokens)
	}
	return PrefillMillis(res.PrefillTokens) + DecodeMillis(p)
}

// StepDuration returns how long the step takes in scaled real time.
func (m *TimingModel) StepDuration(res *StepResult, totalKVTokens int) time.Duration {
	ms := StepMillis(res, totalKVTokens)
	if ms == 0 {
		return 0
	}
	if m.Jitter > 0 && m.rng != nil {
		ms *= 1 + m.Jitter*(2*m.rng.Float64()-1)
	}
	if m.Speedup > 0 {
		ms /= m.Speedup
	}
	return time.Duration(ms * float64(time.Millisecond))
}
