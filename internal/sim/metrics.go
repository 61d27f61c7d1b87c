package sim

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// workerMetrics are a worker's Prometheus metrics under vLLM's names, so
// dashboards and kvbridge's /metrics scraper read kvsim like vLLM.
type workerMetrics struct {
	reg        *prometheus.Registry
	ttft       prometheus.Observer
	itl        prometheus.Observer
	e2e        prometheus.Observer
	promptToks prometheus.Counter
	genToks    prometheus.Counter
	success    prometheus.Counter
	aborted    prometheus.Counter
}

// vLLM's bucket boundaries for these histograms.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
		50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

func newWorkerMetrics(worker, model string, cfg EngineConfig, r *runner) *workerMetrics {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	reg := prometheus.NewRegistry()
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
	}
	counterFunc := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, f))
	}
	total := float64(cfg.NumGPUBlocks)
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
		func() float64 { return float64(r.running.Load()) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
		func() float64 { return float64(r.waiting.Load()) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
		func() float64 { return float64(r.usedBlocks.Load()) / total })
	gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (deprecated vLLM name of vllm:kv_cache_usage_perc).",
		func() float64 { return float64(r.usedBlocks.Load()) / total })
	counterFunc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
		func() float64 { return float64(r.prefixQueries.Load()) })
	counterFunc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
		func() float64 { return float64(r.prefixHits.Load()) })
	// kvsim's own: not a vLLM metric, so it carries the worker's id.
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "kvsim_clock_lag_seconds_total",
		Help:        "Real time the simulated clock skipped because the worker loop fell more than 50 ms behind it; nonzero means timings are stretched.",
		ConstLabels: prometheus.Labels{"model_name": model, "engine": "0", "worker": worker},
	}, func() float64 { return time.Duration(r.lag.Load()).Seconds() }))
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"block_size":            strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks":        strconv.Itoa(cfg.NumGPUBlocks),
			"enable_prefix_caching": "True",
			"engine":                "0",
		},
	})
	info.Set(1)
	reg.MustRegister(info)
	hist := func(name, help string, b []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: labels})
		reg.MustRegister(h)
		return h
	}
	counter := func(name, help string, extra prometheus.Labels) prometheus.Counter {
		l := prometheus.Labels{}
		for k, v := range labels {
			l[k] = v
		}
		for k, v := range extra {
			l[k] = v
		}
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l})
		reg.MustRegister(c)
		return c
	}
	m := &workerMetrics{reg: reg}
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets)
	m.promptToks = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", nil)
	m.genToks = counter("vllm:generation_tokens_total", "Number of generation tokens processed.", nil)
	m.success = counter("vllm:request_success_total", "Count of successfully processed requests.",
		prometheus.Labels{"finished_reason": "length"})
	m.aborted = counter("vllm:request_success_total", "Count of successfully processed requests.",
		prometheus.Labels{"finished_reason": "abort"})
	return m
}
