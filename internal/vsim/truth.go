package vsim

import (
	"math"

	"github.com/kvroute/kvroute/internal/sim"
)

// TruePrefillModel is the simulator's own answer to what the latency cost
// model learns: it runs a request of n uncached tokens alone on a fresh
// engine of cfg, for n spread over [minTokens, maxTokens], times its first
// token with timing (nil: sim.Polynomial), and fits time = overhead +
// n ÷ rate by least squares. It returns rate in tokens/s and overhead in
// seconds.
func TruePrefillModel(cfg sim.EngineConfig, timing sim.Timing, minTokens, maxTokens int) (rate, overhead float64) {
	if timing == nil {
		timing = sim.Polynomial{}
	}
	const points = 64
	var s0, sx, sy, sxx, sxy float64
	for i := 0; i < points; i++ {
		n := minTokens + (maxTokens-minTokens)*i/(points-1)
		eng, err := sim.NewEngine(cfg, nil)
		if err != nil {
			return math.NaN(), math.NaN()
		}
		total := eng.Config().NumGPUBlocks * eng.Config().BlockSize
		prompt := make([]int32, n)
		for j := range prompt {
			prompt[j] = int32(256 + (i*7919+j*104729)%30000)
		}
		if err := eng.Add(1, prompt, 1); err != nil {
			return math.NaN(), math.NaN()
		}
		var ms float64
		for eng.HasWork() {
			res := eng.Step()
			ms += timing.StepMillis(res, total)
		}
		x, y := float64(n), ms/1000
		s0++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	slope := (s0*sxy - sx*sy) / (s0*sxx - sx*sx)
	return 1 / slope, (sy - slope*sx) / s0
}
