package sim

import (
	"math"
	"math/rand/v2"
	"time"
)

// Timing turns an engine step into milliseconds of GPU time. The engine
// reports what a step did (StepResult); a Timing says what that costs on
// some GPU and model. Polynomial is Dynamo's mocker fit; a Profile is a
// measured GPU (see ParseTiming).
type Timing interface {
	// StepMillis returns the step's duration in milliseconds, 0 when it
	// scheduled nothing. totalKVTokens is the engine's KV capacity.
	StepMillis(res *StepResult, totalKVTokens int) float64
	// Name is the name --timing takes for it (a profile's own name for a
	// file).
	Name() string
}

// TimingPolynomial is the name of the default timing, Polynomial.
const TimingPolynomial = "polynomial"

// Polynomial is the polynomial fit published with NVIDIA Dynamo's mocker:
//
//	step_ms   = prefill_ms(T) + decode_ms(p)   (decode_ms only when a request decodes)
//	prefill_ms(T) = 4.209989e-7·T² + 1.518344e-2·T + 16.50142   (0 when T = 0)
//	decode_ms(p)  = max(1, −25.74·p² + 54.01·p + 5.74)
//
// where T is the step's uncached prefill tokens and p the fraction of KV
// capacity (in tokens) held by the requests that decode in the step: a
// prompt being prefilled does not count, not even its chunks already
// computed. A step that only prefills costs prefill_ms(T) alone. Both
// match Dynamo's replay (ai-dynamo 1.6.1, one worker of 5,632 64-token
// blocks): a lone 36,640-token prompt in 8,192-token chunks takes
// 4·prefill_ms(8192) + prefill_ms(3872) = 758.2 ms, and a 60,000-token
// prompt arriving while one request decodes after a 2,048-token prompt
// takes 1,292.7 ms, its eight passes each paying that request's decode_ms.
// Cached context costs nothing: use it to compare with Dynamo's own
// replay.
type Polynomial struct{}

// StepMillis is the package's StepMillis.
func (Polynomial) StepMillis(res *StepResult, totalKVTokens int) float64 {
	return StepMillis(res, totalKVTokens)
}

// Name returns "polynomial".
func (Polynomial) Name() string { return TimingPolynomial }

// TimingModel turns an engine step into scaled real time: Timing's
// duration (Polynomial when nil), divided by Speedup; Jitter, when
// positive, multiplies it by a factor drawn uniformly from
// [1−Jitter, 1+Jitter] with a seeded source.
type TimingModel struct {
	// Timing gives the unscaled step duration; nil means Polynomial.
	Timing Timing
	// Speedup divides every duration; zero means 1.
	Speedup float64
	// Jitter is the relative spread of each step's duration, 0 for none.
	Jitter float64
	rng    *rand.Rand
}

// NewTimingModel returns a model over timing (nil: Polynomial) with the
// given speedup, jitter and jitter seed.
func NewTimingModel(timing Timing, speedup, jitter float64, seed uint64) *TimingModel {
	return &TimingModel{Timing: timing, Speedup: speedup, Jitter: jitter, rng: rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))}
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

// StepMillis returns the polynomial's unscaled, unjittered duration of a
// step in milliseconds, or 0 when the step scheduled nothing.
func StepMillis(res *StepResult, totalKVTokens int) float64 {
	if res.Scheduled == 0 {
		return 0
	}
	p := 0.0
	if totalKVTokens > 0 {
		p = float64(res.DecodeKVTokens+res.DecodeTokens) / float64(totalKVTokens)
	}
	ms := PrefillMillis(res.PrefillTokens)
	if res.DecodeTokens > 0 {
		ms += DecodeMillis(p)
	}
	return ms
}

// StepDuration returns how long the step takes in scaled real time.
func (m *TimingModel) StepDuration(res *StepResult, totalKVTokens int) time.Duration {
	var ms float64
	if m.Timing == nil {
		ms = StepMillis(res, totalKVTokens)
	} else {
		ms = m.Timing.StepMillis(res, totalKVTokens)
	}
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
