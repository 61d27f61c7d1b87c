package engine

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine names a kind of engine, and with it the dialect of its /metrics.
type Engine string

// Supported engines.
const (
	EngineVLLM   Engine = "vllm"
	EngineSGLang Engine = "sglang"
)

// ParseEngine validates an engine name.
func ParseEngine(s string) (Engine, error) {
	switch Engine(s) {
	case EngineVLLM, EngineSGLang:
		return Engine(s), nil
	}
	return "", fmt.Errorf("unknown engine %q (want vllm or sglang)", s)
}

// RankMetrics is what one data-parallel rank's gauges say.
type RankMetrics struct {
	Waiting int
	Running int
	// KVUsage is the fraction (0..1) of the KV cache in use, or -1 if absent.
	KVUsage float64
	// KVUsedTokens is SGLang's sglang:num_used_tokens, or -1 if absent.
	KVUsedTokens float64
	// KVTotalBlocks is vLLM's num_gpu_blocks from vllm:cache_config_info, 0
	// if absent.
	KVTotalBlocks int
	// KVTotalTokens is SGLang's sglang:max_total_num_tokens, 0 if absent.
	KVTotalTokens int
	// BlockSize is vLLM's block_size from vllm:cache_config_info, 0 if absent.
	BlockSize int
}

// EngineMetrics is one scrape of the engine's /metrics, by data-parallel
// rank (vLLM's "engine" label, SGLang's "dp_rank" label; series without the
// label count as rank 0).
type EngineMetrics struct {
	Ranks map[int]*RankMetrics
	// ProcessStart is process_start_time_seconds, 0 if absent. A change means
	// the engine's server process restarted.
	ProcessStart float64
}

// Rank returns rank r's metrics, falling back to rank 0's for an engine that
// labels nothing by rank (one server-wide series).
func (m EngineMetrics) Rank(r int) (RankMetrics, bool) {
	if rm, ok := m.Ranks[r]; ok {
		return *rm, true
	}
	if len(m.Ranks) == 1 {
		if rm, ok := m.Ranks[0]; ok {
			return *rm, true
		}
	}
	return RankMetrics{}, false
}

// KVBlocks converts the rank's KV usage to (used, total) blocks for a load
// report, given the block size in tokens.
func (r RankMetrics) KVBlocks(blockSize int) (used, total int) {
	total = r.KVTotalBlocks
	if total == 0 && r.KVTotalTokens > 0 && blockSize > 0 {
		total = r.KVTotalTokens / blockSize
	}
	switch {
	case r.KVUsedTokens >= 0 && blockSize > 0:
		used = int(math.Ceil(r.KVUsedTokens / float64(blockSize)))
	case r.KVUsage >= 0:
		used = int(math.Round(r.KVUsage * float64(total)))
	}
	if used > total {
		used = total
	}
	if used < 0 {
		used = 0
	}
	return used, total
}

// metricNames maps an engine's gauges to RankMetrics fields. The first name
// present wins, so newer names go first.
type metricNames struct {
	rankLabel   string
	waiting     []string
	running     []string
	usage       []string
	usedTokens  []string
	totalTokens []string
	cacheInfo   string
}

var engineMetricNames = map[Engine]metricNames{
	EngineVLLM: {
		rankLabel: "engine",
		waiting:   []string{"vllm:num_requests_waiting"},
		running:   []string{"vllm:num_requests_running"},
		usage:     []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		cacheInfo: "vllm:cache_config_info",
	},
	EngineSGLang: {
		rankLabel:   "dp_rank",
		waiting:     []string{"sglang:num_queue_reqs"},
		running:     []string{"sglang:num_running_reqs"},
		usage:       []string{"sglang:token_usage"},
		usedTokens:  []string{"sglang:num_used_tokens"},
		totalTokens: []string{"sglang:max_total_num_tokens"},
	},
}

// ErrNoLoadMetrics is returned when a scrape has none of the engine's
// request gauges: the endpoint is not that engine's metrics.
var ErrNoLoadMetrics = errors.New("no request gauges for the engine in /metrics")

// ParseMetrics reads Prometheus text exposition from an engine's /metrics.
// Several series for one rank (e.g. one per tensor-parallel rank, which
// report the same scheduler) are combined by taking the largest value.
func ParseMetrics(engine Engine, r io.Reader) (EngineMetrics, error) {
	names, ok := engineMetricNames[engine]
	if !ok {
		return EngineMetrics{}, fmt.Errorf("parse metrics: unknown engine %q", engine)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return EngineMetrics{}, fmt.Errorf("parse %s metrics: %w", engine, err)
	}
	out := EngineMetrics{Ranks: map[int]*RankMetrics{}}
	rank := func(m *dto.Metric) (*RankMetrics, bool) {
		r := 0
		for _, lp := range m.GetLabel() {
			if lp.GetName() == names.rankLabel {
				v, err := strconv.Atoi(lp.GetValue())
				if err != nil || v < 0 {
					return nil, false
				}
				r = v
			}
		}
		rm, ok := out.Ranks[r]
		if !ok {
			rm = &RankMetrics{KVUsage: -1, KVUsedTokens: -1}
			out.Ranks[r] = rm
		}
		return rm, true
	}
	found := false
	each := func(candidates []string, set func(rm *RankMetrics, v float64)) {
		for _, name := range candidates {
			mf, ok := families[name]
			if !ok {
				continue
			}
			for _, m := range mf.GetMetric() {
				v, ok := value(m)
				if !ok {
					continue
				}
				if rm, ok := rank(m); ok {
					set(rm, v)
				}
			}
			return
		}
	}
	each(names.waiting, func(rm *RankMetrics, v float64) { found = true; rm.Waiting = max(rm.Waiting, count(v)) })
	each(names.running, func(rm *RankMetrics, v float64) { found = true; rm.Running = max(rm.Running, count(v)) })
	each(names.usage, func(rm *RankMetrics, v float64) { rm.KVUsage = max(rm.KVUsage, clamp01(v)) })
	each(names.usedTokens, func(rm *RankMetrics, v float64) { rm.KVUsedTokens = max(rm.KVUsedTokens, math.Max(v, 0)) })
	each(names.totalTokens, func(rm *RankMetrics, v float64) { rm.KVTotalTokens = max(rm.KVTotalTokens, count(v)) })
	if mf, ok := families[names.cacheInfo]; ok && names.cacheInfo != "" {
		for _, m := range mf.GetMetric() {
			rm, ok := rank(m)
			if !ok {
				continue
			}
			for _, lp := range m.GetLabel() {
				v, err := strconv.Atoi(lp.GetValue())
				if err != nil || v < 0 {
					continue
				}
				switch lp.GetName() {
				case "num_gpu_blocks":
					rm.KVTotalBlocks = v
				case "block_size":
					rm.BlockSize = v
				}
			}
		}
	}
	if mf, ok := families["process_start_time_seconds"]; ok && len(mf.GetMetric()) > 0 {
		out.ProcessStart, _ = value(mf.GetMetric()[0])
	}
	if !found {
		return out, fmt.Errorf("parse %s metrics: %w", engine, ErrNoLoadMetrics)
	}
	return out, nil
}

func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Counter != nil:
		v = m.Counter.GetValue()
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

func count(v float64) int {
	if v < 0 {
		return 0
	}
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(math.Round(v))
}

func clamp01(v float64) float64 { return math.Min(math.Max(v, 0), 1) }
