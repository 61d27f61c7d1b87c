// Package bench is kvbench's engine: workloads (Mooncake-format traces,
// shared-prefix groups, multi-turn chat sessions), an OpenAI streaming client
// that measures TTFT, inter-token latency and end-to-end latency, an arrival
// scheduler (trace timestamps, Poisson, fixed concurrency), the reference hit
// rates a workload allows (infinite cache and an LRU the size of the fleet),
// an A/B runner over kvroute's router modes, and the reports (Markdown, JSON,
// an SVG chart, a progress bar).
//
// Env starts the whole system in one process for the demo and the end-to-end
// tests: embedded NATS and etcd, simulated workers (internal/sim), a kvroute
// router (package server) and a real Envoy (package envoy/proxy).
package bench
