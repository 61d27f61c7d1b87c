// Package engine is everything that talks to a vLLM or SGLang engine
// itself: its HTTP answers (/metrics into load, /v1/models, /health;
// Client, ParseMetrics, ParseModels) and following its ZMQ KV events (Follow:
// a Stream over a dialled vllmzmq.Subscriber or a bound vllmzmq.Listener,
// healing sequence gaps from the engine's replay socket and handing the
// batches, numbered as the engine numbered them, to an EventSink).
//
// Two programs use it: kvbridge (package bridge), whose sink republishes on
// NATS, and the router following engines itself (engine/feed), whose sink
// is the KV event core (kvevents).
package engine
