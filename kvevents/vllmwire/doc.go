// Package vllmwire is vLLM's KV event wire format: the event types
// (EventBatch, BlockStored, BlockRemoved, AllBlocksCleared, EngineHash), the
// msgpack decoder (DecodeBatch: every layout vLLM has shipped, validated at
// the edge, no panics on input) and the encoder that writes a decoded batch
// back byte for byte (EncodeBatch, AppendBatch), with the raw msgpack reader
// the index uses for extra_keys (Reader).
//
// It imports nothing of kvroute's, so transports, the simulator and tools
// decode and encode events without the index; kvindex applies the decoded
// events and kvevents feeds them to it (docs/architecture.md §3.2).
package vllmwire
