package vsim

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/scoring"
)

// SweepOptions is one sweep: every mode at every load.
type SweepOptions struct {
	Fleet Fleet
	// Router is the router's configuration; Mode is set per run.
	Router scoring.Options
	Modes  []string
	Loads  []float64
	// SLO is the TTFT p90 target that defines goodput.
	SLO  time.Duration
	Seed uint64
	// Parallel runs at most this many simulations at once (each is one
	// goroutine); 0 means GOMAXPROCS. Results do not depend on it.
	Parallel int
	// Progress, when set, is called after each run.
	Progress func(done, total int, r Result)
	// RouterCost times the router's calls in every run (Report.
	// RouterCost); with Parallel 1 it also measures the index's heap.
	RouterCost bool
	// Requests keeps every run's per-request records (Report.Records).
	Requests bool
	// Explain names requests, by index in the workload's arrival order,
	// whose decisions every run explains (Report.Explains).
	Explain map[int]bool
}

// Report is a sweep's outcome, in the JSON shape of kvbench's reports with
// the sweep added.
type Report struct {
	Workload map[string]any `json:"workload"`
	// IdealHitRate is the infinite-cache reference, IdealFleet an LRU of
	// the fleet's capacity.
	IdealHitRate float64        `json:"ideal_hit_rate"`
	IdealFleet   float64        `json:"ideal_hit_rate_fleet"`
	Setup        map[string]any `json:"setup"`
	Order        []string       `json:"order"`
	// Modes holds each mode's run at load 1, when load 1 was swept.
	Modes map[string]*Result `json:"modes"`
	Loads []float64          `json:"loads"`
	SLO   struct {
		TTFTP90Ms float64 `json:"ttft_p90_ms"`
	} `json:"slo"`
	Sweep map[string][]Point `json:"sweep"`
	// Goodput is, per mode, the highest swept load whose TTFT p90 meets the
	// SLO (with no shed request), or 0.
	Goodput map[string]float64 `json:"goodput"`
	// RouterCost is, per mode and aligned with Loads, the router's CPU in
	// each run, when SweepOptions.RouterCost asked for it.
	RouterCost map[string][]*RouterCost `json:"router_cost,omitempty"`
	// Records holds every run's per-request records, mode by mode in
	// Order and load by load, when SweepOptions.Requests asked for them.
	Records []RequestRecord `json:"-"`
	// Explains holds the explanations SweepOptions.Explain asked for, in
	// the same order.
	Explains []ExplainRecord `json:"-"`
}

// Sweep runs every mode at every load on w and reports them with the
// workload's reference hit rates.
func Sweep(w *Workload, o SweepOptions) (*Report, error) {
	if len(o.Modes) == 0 || len(o.Loads) == 0 {
		return nil, fmt.Errorf("sweep needs at least one mode and one load")
	}
	if !slices.IsSorted(o.Loads) {
		return nil, fmt.Errorf("sweep loads %v must be ascending", o.Loads)
	}
	for _, m := range o.Modes {
		opts := o.Router
		opts.Mode = m
		if err := opts.Validate(); err != nil {
			return nil, err
		}
	}
	type job struct{ m, l int }
	jobs := make(chan job)
	results := make([][]Result, len(o.Modes))
	for i := range results {
		results[i] = make([]Result, len(o.Loads))
	}
	errs := make([]error, len(o.Modes)*len(o.Loads))
	par := o.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	what := measureNone
	switch {
	case o.RouterCost && par == 1:
		what = measureHeap
	case o.RouterCost:
		what = measureCPU
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	done, total := 0, len(o.Modes)*len(o.Loads)
	for range min(par, total) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				opts := o.Router
				opts.Mode = o.Modes[j.m]
				r, err := runRecorded(w, o.Fleet, opts, o.Loads[j.l], o.Seed, what, recording{requests: o.Requests, explain: o.Explain})
				results[j.m][j.l], errs[j.m*len(o.Loads)+j.l] = r, err
				if o.Progress != nil {
					mu.Lock()
					done++
					o.Progress(done, total, r)
					mu.Unlock()
				}
			}
		}()
	}
	// Heaviest first (high loads of the first modes), so the last runs
	// to finish are short ones.
	for l := len(o.Loads) - 1; l >= 0; l-- {
		for m := range o.Modes {
			jobs <- job{m, l}
		}
	}
	close(jobs)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}

	rep := &Report{Workload: map[string]any{"name": w.Name, "requests": w.Requests()}, Setup: setupOf(o),
		Order: o.Modes, Modes: map[string]*Result{}, Loads: o.Loads, Sweep: map[string][]Point{}, Goodput: map[string]float64{}}
	for k, v := range w.Params {
		rep.Workload[k] = v
	}
	rep.SLO.TTFTP90Ms = ms(o.SLO)
	ideal, ok := bench.IdealOf(func(yield func([]int32)) { w.Prompts(o.Fleet.Engine, yield) },
		blockSizeOf(o.Fleet), o.Fleet.Workers*blocksOf(o.Fleet))
	if ok {
		rep.IdealHitRate, rep.IdealFleet = ideal.Infinite, ideal.Fleet
	}
	for m, name := range o.Modes {
		meets := true
		rep.Goodput[name] = 0
		for l := range o.Loads {
			r := results[m][l]
			rep.Sweep[name] = append(rep.Sweep[name], r.Point)
			rep.Records = append(rep.Records, r.Records...)
			rep.Explains = append(rep.Explains, r.Explains...)
			r.Records, r.Explains = nil, nil
			if r.RouterCost != nil {
				if rep.RouterCost == nil {
					rep.RouterCost = map[string][]*RouterCost{}
				}
				rep.RouterCost[name] = append(rep.RouterCost[name], r.RouterCost)
			}
			if r.Load == 1 {
				rr := r
				rep.Modes[name] = &rr
			}
			// Loads are ascending: goodput is the top of the run of loads,
			// from the lowest, that meet the SLO with nothing shed.
			meets = meets && r.Errors == 0 && r.TTFT.P90 <= ms(o.SLO)
			if meets {
				rep.Goodput[name] = r.Load
			}
		}
	}
	return rep, nil
}

func blockSizeOf(f Fleet) int {
	if f.Engine.BlockSize > 0 {
		return f.Engine.BlockSize
	}
	return 64
}

func blocksOf(f Fleet) int {
	if f.Engine.NumGPUBlocks > 0 {
		return f.Engine.NumGPUBlocks
	}
	return 16384
}

func setupOf(o SweepOptions) map[string]any {
	r := o.Router
	s := map[string]any{
		"workers": o.Fleet.Workers, "kv_blocks": blocksOf(o.Fleet), "block_size": blockSizeOf(o.Fleet),
		"event_lag_ms": ms(o.Fleet.EventLag), "load_report_ms": ms(o.Fleet.ReportEvery), "seed": o.Seed,
		"clock": "virtual", "timing": TimingLabel(o.Fleet.Timing),
		"router": map[string]any{
			"cost_model": r.CostModel, "temperature": r.Temperature, "queue_threshold": r.QueueThreshold,
		},
	}
	if p, ok := o.Fleet.Timing.(*sim.Profile); ok {
		// The coefficients too: a profile file can change under its name.
		s["timing_profile"] = p
	}
	return s
}

// polynomialLabel is how reports name sim.Polynomial.
const polynomialLabel = "Dynamo mocker polynomial"

// TimingLabel is how reports name a timing: "Dynamo mocker polynomial" for
// sim.Polynomial (and nil), else the profile's name.
func TimingLabel(t sim.Timing) string {
	if t == nil || t.Name() == sim.TimingPolynomial {
		return polynomialLabel
	}
	return t.Name()
}
