// Package sim simulates vLLM-like inference workers for kvroute's tests,
// demos and benchmarks.
//
// The Engine is a pure state machine with no goroutines and no clock: a
// paged KV cache with prefix caching (block pool, reference counts, an LRU
// free queue), continuous batching with chunked prefill and preemption by
// recompute, and KV cache events emitted through a sink. The caller steps it
// and turns each step into simulated time with a Timing: Polynomial, the
// Dynamo mocker's fit, or a Profile measured on a GPU (ParseTiming: the
// built-in h100-llama3-8b or a profile file), which also charges the
// cached context a step's requests attend to.
//
// A Worker wraps one Engine in a goroutine that steps it in scaled real
// time, serves the OpenAI API over HTTP, publishes KV events and load
// reports to NATS and registers itself in etcd. StartFleet runs many
// workers in one process, which is what cmd/kvsim and the demo use.
package sim
